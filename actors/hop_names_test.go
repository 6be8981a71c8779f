package actors

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/asynkron/protoactor-go/actor"
)

// TestHopstatNamesSessionHops: hopstat (internal/hoptrace/hopstat) finds
// a request's hops by the names a session shell marks them with: its side,
// a dot, and the %T of the message it receives (shell.Receive). A hop of
// its list that no shell marks is missing on every request, and hopstat
// drops every request as incomplete: it prints no breakdown at all. The tx
// parent sends a resolved RequestData to its session as a pointer
// (txParent.onRequestData), marked "tx.*actors.txPeerRequestMsg".
func TestHopstatNamesSessionHops(t *testing.T) {
	src, err := os.ReadFile(filepath.Join("..", "internal", "hoptrace", "hopstat", "main.go"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []struct {
		side string
		msg  any
	}{
		{"rx", &actor.Started{}},
		{"tx", &txPeerRequestMsg{}},
		{"tx", TxSubmitted{}},
		{"tx", TxCompleted{}},
		{"tx", TxFlushed{}},
		{"rx", RxFrame{}},
	} {
		hop := fmt.Sprintf("%s.%T", m.side, m.msg)
		if !strings.Contains(string(src), strconv.Quote(hop)) {
			t.Errorf("hopstat's round trip does not name the hop %q that the %s session marks", hop, m.side)
		}
	}
}
