package messages_test

import (
	"testing"

	"github.com/kvxfer/kvxfer/messages"
)

func BenchmarkEncodeResult(b *testing.B) {
	f := sampleResult()
	b.SetBytes(int64(len(mustEncode(b, f))))
	b.ReportAllocs()
	var buf []byte
	for b.Loop() {
		var err error
		if buf, err = messages.AppendEncode(buf[:0], f); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeResult(b *testing.B) {
	benchmarkDecode(b, sampleResult())
}

func BenchmarkEncodeRequestData(b *testing.B) {
	f := sampleRequestData(256)
	b.SetBytes(int64(len(mustEncode(b, f))))
	b.ReportAllocs()
	var buf []byte
	for b.Loop() {
		var err error
		if buf, err = messages.AppendEncode(buf[:0], f); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecodeRequestData: a request naming 256+2 destination blocks.
func BenchmarkDecodeRequestData(b *testing.B) {
	benchmarkDecode(b, sampleRequestData(256))
}

func benchmarkDecode(b *testing.B, f messages.Frame) {
	enc := mustEncode(b, f)
	b.SetBytes(int64(len(enc)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := messages.Decode(enc); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecodeMaxRequestData: the largest valid frame (MaxBlocks
// destination blocks, MaxRemap extents), where Decode's first pass, which
// counts every block, costs the most.
func BenchmarkDecodeMaxRequestData(b *testing.B) {
	benchmarkDecode(b, maxRequestData())
}
