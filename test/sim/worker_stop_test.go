package sim

import (
	"testing"
)

// TestCtxWorkerStop keeps fixed an engine bug that FaultWorkerDead found
// once it could stop a context rank's worker (Config.CtxWorkerStops).
//
// A sender worker of a context rank spends its restart budget and stops;
// every session hears TxWorkerDead. A session that Send had adopted but
// that had no stream on that worker yet ignores it (TxSession.onWorkerDead:
// no stream uses the worker, nothing fails). A generation rank's
// RequestData that comes later opens a stream that WorkerFor routes to the
// dead worker (TxSession.onPeerRequest); its ops are submitted to
// shellEnv.opWorker, which is nil for a dead worker, so they are dropped,
// never posted and never answered: they stay SUBMITTING, then IN_DOUBT at
// the deadline, the CloseEndpoint that would retire them is dropped the
// same way, and the session never drains: its source pages stay pinned and
// Done never fires (seed 6400: ctx0.0/tx/req-0's stream to gen/2 on
// worker 0, which stopped 8.7 ms before that RequestData came; the
// session ends with chunks 0 and 1 pinned).
//
// Fixed: the session remembers the workers TxWorkerDead named and refuses
// (FAILED, nothing admitted) a stream that would run on one; and the tx
// parent opens no new session once a worker stopped for good. (It failed
// 3 of 3 seeds and 198 of 20,000 before.)
func TestCtxWorkerStop(t *testing.T) {
	for _, seed := range []uint64{6400, 8504, 4068} {
		if res := Run(Config{Seed: seed, CtxWorkerStops: true}); res.Failure != nil {
			t.Errorf("%v\n\treproduce: go test -tags kvxfer_invariants ./test/sim -run 'TestSeed$' -seed=%d -ctx-worker-stops -v",
				res.Failure, seed)
		}
	}
	sw := RunSeeds(1, defaultSeeds, false, Config{CtxWorkerStops: true})
	for i, f := range sw.Failures {
		if i == 3 {
			t.Errorf("… and %d more failing seeds", len(sw.Failures)-3)
			break
		}
		t.Errorf("%v", f)
	}
}
