package zmq

import (
	"testing"

	"go.uber.org/goleak"
)

// No goroutine is ignored: Links do not use zmq4's process-global ZAP
// handler (AuthStart), the only zmq4 code that starts a goroutine.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
