package shm_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma/rdmatest"
	"github.com/kvxfer/kvxfer/rdma/shm"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// newRegion makes a shared region released at cleanup.
func newRegion(t *testing.T, n uint64) (*kvcache.Region, error) {
	r, c, err := shm.NewRegion("", n)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("region Close: %v", err)
		}
	})
	return r, nil
}

func pair(t *testing.T) rdmatest.Pair {
	return rdmatest.Pair{
		Sender:   shm.New(),
		Receiver: shm.New(),
		NewDst:   func(n uint64) (*kvcache.Region, error) { return newRegion(t, n) },
	}
}

func TestConformance(t *testing.T) { rdmatest.Run(t, pair) }

// TestConformanceSharedSources: sources may be shared regions too.
func TestConformanceSharedSources(t *testing.T) {
	rdmatest.Run(t, func(t *testing.T) rdmatest.Pair {
		p := pair(t)
		p.NewSrc = p.NewDst
		return p
	})
}
