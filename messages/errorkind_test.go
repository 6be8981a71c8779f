package messages_test

import (
	"bytes"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/kvxfer/kvxfer/messages"
	"github.com/kvxfer/kvxfer/messages/pb"
)

// TestResultErrorKind: Result.ErrorKind (field 8) survives the wire, and
// a Result without a kind encodes as a build before the field writes it,
// so that an older peer reads it and a newer one reads an older peer's
// Result (no field 8) as ErrorKindUnspecified. A kind this build does not
// define (a newer writer's, negative too) is accepted with any status and
// kept as it came, never a reason to refuse the frame; a defined kind on
// a Result that is not FAILED is refused both ways, naming the status
// and the kind. (Checked to fail without the field: the round trip loses
// the kind.)
func TestResultErrorKind(t *testing.T) {
	peer := messages.PeerID{Instance: "ctx-0", Rank: 1}
	failed := &messages.Result{RequestID: "req-1", Epoch: 1, From: peer, Status: messages.StatusFailed, Error: "reworded"}
	plain := mustEncode(t, failed)
	withKind := *failed
	withKind.ErrorKind = messages.ErrorKindPromptMismatch
	b := mustEncode(t, &withKind)
	if f, err := messages.Decode(b); err != nil || !reflect.DeepEqual(f, &withKind) {
		t.Fatalf("a FAILED Result of kind PROMPT_MISMATCH decodes as %#v, %v; want %#v", f, err, &withKind)
	}
	// As an older build writes a FAILED Result, and with field 8 after.
	body := bytesField(rawResult("req-1", 2), 6, []byte("reworded"))
	if old := rawEnvelope(1, fieldResult, body); !bytes.Equal(plain, old) {
		t.Fatalf("a FAILED Result of no kind encodes as %x, want the older encoding %x", plain, old)
	}
	if want := rawEnvelope(1, fieldResult, varintField(bytes.Clone(body), 8, 1)); !bytes.Equal(b, want) {
		t.Fatalf("with the kind: %x, want the older encoding with field 8 = 1: %x", b, want)
	}
	fields := pb.File_messages_proto_kvxfer_proto.Messages()
	if got := fields.ByName("Result").Fields().ByName("error_kind").Number(); got != 8 {
		t.Fatalf("Result.error_kind is field %d, want 8", got)
	}

	// An older writer's FAILED Result, as it writes it: no field 8.
	old := rawEnvelope(1, fieldResult, bytesField(rawResult("req-1", 2), 6, []byte("planned a prompt of 32 tokens")))
	f, err := messages.Decode(old)
	if err != nil {
		t.Fatalf("an older writer's FAILED Result: %v", err)
	}
	if r := f.(*messages.Result); r.ErrorKind != messages.ErrorKindUnspecified || r.Status != messages.StatusFailed {
		t.Fatalf("an older writer's FAILED Result decodes as %#v, want status FAILED, kind UNSPECIFIED", r)
	}

	// A newer writer's kinds: accepted with any status, kept as they came.
	for _, kind := range []int64{2, 7, math.MaxInt32, -1} {
		for _, st := range []uint64{1, 2, 3, 4} {
			raw := rawEnvelope(1, fieldResult, varintField(rawResult("req-1", st), 8, uint64(kind)))
			f, err := messages.Decode(raw)
			if err != nil {
				t.Fatalf("status %d, error kind %d from a newer writer: %v; want it accepted", st, kind, err)
			}
			r := f.(*messages.Result)
			if r.ErrorKind != messages.ErrorKind(kind) || r.ErrorKind.Defined() {
				t.Fatalf("status %d, error kind %d decodes as kind %v", st, kind, r.ErrorKind)
			}
			if _, err := messages.Encode(r); err != nil {
				t.Fatalf("status %d, error kind %d: re-encode: %v", st, kind, err)
			}
		}
	}
	if got := messages.ErrorKind(7).String(); got != "ErrorKind(7)" {
		t.Fatalf("ErrorKind(7).String() = %q", got)
	}

	// A defined kind on a Result that is not FAILED is a contradiction.
	for _, st := range []messages.Status{messages.StatusSuccess, messages.StatusInDoubt, messages.StatusCancelled} {
		r := &messages.Result{RequestID: "req-1", Epoch: 1, From: peer, Status: st, ErrorKind: messages.ErrorKindPromptMismatch}
		want := "result status " + st.String() + " with error kind PROMPT_MISMATCH (1)"
		if _, err := messages.Encode(r); !errors.Is(err, messages.ErrInvalid) || !strings.Contains(err.Error(), want) {
			t.Fatalf("Encode of a %v Result of kind PROMPT_MISMATCH: %v; want ErrInvalid naming %q", st, err, want)
		}
		raw := rawEnvelope(1, fieldResult, varintField(rawResult("req-1", uint64(st)), 8, 1))
		_, err := messages.Decode(raw)
		var inv *messages.InvalidFrame
		if !errors.As(err, &inv) || !errors.Is(err, messages.ErrInvalid) || !strings.Contains(err.Error(), want) {
			t.Fatalf("Decode of a %v Result of kind PROMPT_MISMATCH: %v; want an InvalidFrame naming %q", st, err, want)
		}
	}
}
