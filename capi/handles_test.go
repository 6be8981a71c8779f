package capi

import (
	"strings"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer"
)

// A handle of another kind is named with its kind and the right article:
// "request handle 1 is a engine handle" read as a typo in the one message
// a C caller gets for swapping two handles (checked to fail: "a engine").
func TestHandleOfAnotherKindNamed(t *testing.T) {
	e := open(t, "capi-kind")
	defer e.Close(5 * time.Second)
	_, rh, err := e.Send(SendRequest{SendRequest: kvxfer.SendRequest{ID: "r", PromptLen: 32}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = LookupRequest(e.Handle())
	if Code(err) != ErrBadHandle || !strings.Contains(err.Error(), "is an engine handle") {
		t.Fatalf("an engine handle as a request: %v", err)
	}
	_, err = LookupEngine(rh)
	if Code(err) != ErrBadHandle || !strings.Contains(err.Error(), "is a request handle") {
		t.Fatalf("a request handle as an engine: %v", err)
	}
}
