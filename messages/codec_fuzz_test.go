package messages_test

import (
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"testing"
)

// Run a fuzzer with, for example:
//
//	go test -run '^$' -fuzz '^FuzzDecode$' -fuzztime 20s ./messages/
//
// Seeds come from fuzzSeeds and from testdata/fuzz/<Fuzzer>/ (written by
// `go test ./messages/ -run TestWriteSeedCorpus -update-corpus`); plain
// `go test` runs every seed as a test.

var updateCorpus = flag.Bool("update-corpus", false, "rewrite testdata/fuzz seed corpora from the sample frames")

// fuzzSeeds returns named seed inputs: the encoding of every sample frame
// and a few hostile ones.
func fuzzSeeds(tb testing.TB) map[string][]byte {
	seeds := map[string][]byte{
		"garbage_empty":         {},
		"garbage_ff":            {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01},
		"garbage_version2":      rawEnvelope(2, fieldHeartbeat, rawHeartbeat()),
		"garbage_unknown_type":  rawEnvelope(1, 99, rawHeartbeat()),
		"garbage_status257":     rawEnvelope(1, fieldResult, rawResult("req-1", 257)),
		"garbage_rank_minus1":   rawEnvelope(1, fieldHeartbeat, bytesField(nil, 1, rawPeer("p", 0xffffffff))),
		"garbage_bad_utf8":      rawEnvelope(1, fieldResult, rawResult("req-\xff", 1)),
		"garbage_open_group":    []byte{0x08, 0x01, 0x93, 0x03},
		"garbage_long_length":   []byte{0x08, 0x01, 0x3a, 0xff, 0xff, 0xff, 0xff, 0x0f},
		"unpacked_request_data": rawEnvelope(1, fieldRequestData, unpackedRequestData()),
	}
	// A Hello whose pool size wraps uint64: 2 blocks of 2^63 bytes.
	hello := bytesField(nil, 1, rawPeer("ctx-0", 0))
	hello = bytesField(hello, 2, []byte("ucx"))
	hello = bytesField(hello, 3, []byte{1})
	hello = bytesField(hello, 4, varintField(bytesField(nil, 1, []byte{1}), 2, math.MaxUint64))
	hello = bytesField(hello, 6, varintField(varintField(nil, 1, 1), 2, 1))
	hello = bytesField(hello, 9, varintField(varintField(nil, 2, 1<<63), 3, 2))
	seeds["garbage_pool_overflow"] = rawEnvelope(1, fieldHello, hello)
	for name, f := range sampleFrames() {
		seeds[name] = mustEncode(tb, f)
	}
	seeds["request_data_256"] = mustEncode(tb, sampleRequestData(256))
	return seeds
}

// unpackedRequestData writes the blocks one tag each, as an old or foreign
// encoder may: Decode accepts it and Encode packs it.
func unpackedRequestData() []byte {
	var group []byte
	for _, b := range []uint64{4, 5, 6} {
		group = varintField(group, 2, b)
	}
	par := varintField(varintField(nil, 1, 1), 2, 1)
	b := bytesField(nil, 1, []byte("req-unpacked"))
	b = bytesField(b, 3, rawPeer("gen-0", 0))
	b = bytesField(b, 4, par)
	return bytesField(b, 8, group)
}

func addSeeds(f *testing.F) {
	seeds := fuzzSeeds(f)
	names := make([]string, 0, len(seeds))
	for name := range seeds {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		f.Add(seeds[name])
	}
}

// FuzzDecode: Decode never panics; what it accepts is valid and survives
// Encode then Decode unchanged.
func FuzzDecode(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		checkDecodes(t, b)
	})
}

// FuzzDecodeSplit: the input split at every byte, each part decoded alone.
func FuzzDecodeSplit(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) > 4096 {
			b = b[:4096] // keep one input's work linear in a small bound
		}
		checkDecodes(t, b)
		for i := 0; i <= len(b); i++ {
			checkDecodes(t, b[:i])
			checkDecodes(t, b[i:])
		}
	})
}

// TestWriteSeedCorpus rewrites the committed seed corpora; without
// -update-corpus it checks that every seed of fuzzSeeds is committed, as
// -update-corpus writes it (a sample frame added without its seed, or
// changed since, fails). Other files there (inputs a fuzzer found) are
// left alone.
func TestWriteSeedCorpus(t *testing.T) {
	for _, fuzzer := range []string{"FuzzDecode", "FuzzDecodeSplit"} {
		dir := filepath.Join("testdata", "fuzz", fuzzer)
		if *updateCorpus {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		for name, b := range fuzzSeeds(t) {
			path := filepath.Join(dir, "seed_"+name)
			body := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", b)
			if !*updateCorpus {
				if got, err := os.ReadFile(path); err != nil {
					t.Errorf("seed %s is not committed (run with -update-corpus): %v", path, err)
				} else if string(got) != body {
					t.Errorf("seed %s is not the sample's encoding (run with -update-corpus)", path)
				}
				continue
			}
			if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
}
