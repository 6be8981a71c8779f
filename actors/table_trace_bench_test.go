package actors

import (
	"testing"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvxfer/kvxfer/actors/core"
	"github.com/kvxfer/kvxfer/rdma"
)

// BenchmarkWorkerTableOp is a worker's table work per op — Admit,
// Endpoint, Settle — on the core table directly and through the shell's
// recording wrapper with no recorder (what every untraced engine runs):
// the difference is what recording costs when it is off.
func BenchmarkWorkerTableOp(b *testing.B) {
	const key = "peer-0"
	pid := actor.NewPID("local", "session")
	op := func(i int) core.OpRef { return core.OpRef{Request: "r1", Seq: i} }
	b.Run("core", func(b *testing.B) {
		t := core.NewWorkerTable[*actor.PID, rdma.Endpoint]()
		t.Connected(key, nil, nil)
		b.ReportAllocs()
		for i := range b.N {
			t.Admit(op(i), pid, key)
			t.Endpoint(key, nil)
			t.Settle(op(i))
		}
	})
	b.Run("shell-untraced", func(b *testing.B) {
		env := &shellEnv{clock: SystemClock{}}
		t := env.workerTable(0)
		if t.tr != nil {
			b.Fatal("an engine without a recorder traces its worker table")
		}
		t.Connected(key, nil, nil)
		b.ReportAllocs()
		for i := range b.N {
			t.Admit(op(i), pid, key)
			t.Endpoint(key, nil)
			t.Settle(op(i))
		}
	})
}
