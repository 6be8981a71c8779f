package node_test

import (
	"context"
	"errors"
	"strings"
	"syscall"
	"testing"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/node"
	"github.com/kvxfer/kvxfer/rdma/shm"
	"github.com/kvxfer/kvxfer/rdma/ucx"
)

// callerMemory maps anonymous memory as a framework would allocate its KV
// cache and lays kind-shaped tensors of blocks blocks for every layer of
// c's rank out in it, each layer's tensor gap bytes after the previous
// one's end (separately allocated tensors). The mapping is unmapped when
// the test ends, after the nodes' cleanups closed them (registered first,
// cleaned up last).
func callerMemory(t *testing.T, c node.Config, kind string, blocks int, gap uint64) *node.CallerMemory {
	t.Helper()
	l, s, err := kvxfer.Config{Layout: c.Layout, Parallel: kvcache.Parallel{TP: 1, PP: 1}}.LayoutShape()
	if err != nil {
		t.Fatal(err)
	}
	part := uint64(l.TokensPerBlock*s.Heads()*l.HeadDim*l.DTypeBytes) * uint64(blocks)
	var offs [][]uint64
	var end uint64
	for g := range l.Groups {
		var o []uint64
		for range s.Layers[g] {
			o = append(o, end)
			end += uint64(l.Parts())*part + gap
		}
		offs = append(offs, o)
	}
	mem, err := syscall.Mmap(-1, 0, int(end), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := syscall.Munmap(mem); err != nil {
			t.Error(err)
		}
	})
	region, err := kvcache.HostBytesRegion(mem)
	if err != nil {
		t.Fatal(err)
	}
	cm := &node.CallerMemory{Region: region}
	for g := range l.Groups {
		d, err := kvcache.FrameworkMemory(kind, l, s, g, blocks, offs[g], nil, end)
		if err != nil {
			t.Fatal(err)
		}
		cm.Memory = append(cm.Memory, d)
	}
	return cm
}

// TestCallerMemoryMovesIntoTheFrameworksTensors: a context node (send-only)
// and a generation node, each over KV tensors its framework allocated
// (anonymous memory, no pool of the node's own; NHD on the context side,
// HND with gaps between the layers' tensors on the generation side), move
// a request into the framework's block ids; every byte lands where the
// generation side's layout says, and the bytes between the tensors stay
// untouched. Over ucx; over shm only the send-only side can be caller
// memory (the generation side then lays its tensors out in its pool).
// (Checked to fail: with Open passing the engine no CallerMemory.Memory, so
// that it lays a pool of its own over the region, both cases fail: the
// bytes are not where the framework's layout says.)
func TestCallerMemoryMovesIntoTheFrameworksTensors(t *testing.T) {
	for _, b := range backends() {
		t.Run(b, func(t *testing.T) {
			cc, gc := pair(t, b)
			cc.PoolBytes, gc.PoolBytes = 0, 0
			cc.SendOnly = true
			cc.CallerMemory = callerMemory(t, cc, "nhd", 12, 0)
			if b == ucx.Backend {
				gc.CallerMemory = callerMemory(t, gc, "hnd", 10, 4096)
			} else {
				gc.Memory = &node.Memory{Kind: "hnd", NumBlocks: 10}
			}
			genN, ctxN := open(t, gc), open(t, cc)
			ce, ge := ctxN.Engine(), genN.Engine()
			if ce.Region() != cc.CallerMemory.Region {
				t.Fatalf("context engine's region %p, want the caller's %p", ce.Region(), cc.CallerMemory.Region)
			}
			if gc.CallerMemory != nil && ge.Region() != gc.CallerMemory.Region {
				t.Fatalf("generation engine's region %p, want the caller's %p", ge.Region(), gc.CallerMemory.Region)
			}
			ctx, cancel := context.WithTimeout(context.Background(), patience)
			defer cancel()
			if err := genN.WaitPeers(ctx); err != nil {
				t.Fatal(err)
			}
			// Written and checked through the framework's own descriptors
			// (the engine's would agree with themselves whatever it laid out).
			dstMem := ge.Memory(0) // the generation side's pool layout (shm)
			if gc.CallerMemory != nil {
				dstMem = gc.CallerMemory.Memory[0]
			}
			dst := ge.Region().Bytes()
			written := moveIntoBlocks(t, genN, ce, "caller", cc.CallerMemory.Region.Bytes(), cc.CallerMemory.Memory[0], dstMem, dst)
			for off, w := range written {
				if !w && dst[off] != 0 {
					t.Fatalf("byte %d of the generation side's memory is %#x: written outside the blocks' described bytes", off, dst[off])
				}
			}
		})
	}
}

// TestCallerMemoryRefusals: what cannot work over the framework's memory is
// refused at Open, naming the value and the way out, before anything opens.
// (Checked to fail: with validateCallerMemory's shm rule removed, the
// receiving shm node opens.)
func TestCallerMemoryRefusals(t *testing.T) {
	cm := callerMemory(t, node.Config{Layout: tiny()}, "nhd", 4, 0)
	dev, err := kvcache.ExternalDeviceRegion(1<<40, cm.Region.Len, 0)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		edit func(*node.Config)
		want []string
	}{
		{"receiving on shm", func(c *node.Config) { c.Backend = shm.Backend },
			[]string{`backend = "shm"`, "/dev/shm file", `use backend "ucx"`}},
		{"device memory on shm", func(c *node.Config) {
			c.Backend, c.SendOnly = shm.Backend, true
			c.CallerMemory = &node.CallerMemory{Region: dev, Memory: cm.Memory}
		}, []string{`backend = "shm"`, "GPU memory", "host memory only"}},
		{"revocation", func(c *node.Config) { c.Backend, c.SendOnly, c.RevokeSpareBytes = shm.Backend, true, 1<<16 },
			[]string{"revoke_spare_bytes = 65536", "does not revoke"}},
		{"a pool size", func(c *node.Config) { c.Backend, c.SendOnly, c.PoolBytes = shm.Backend, true, 1<<20+1 },
			[]string{"pool_bytes = 1048577", "leave pool_bytes 0"}},
		{"with memory", func(c *node.Config) {
			c.Backend, c.SendOnly, c.Memory = shm.Backend, true, &node.Memory{Kind: "nhd", NumBlocks: 4}
		}, []string{"memory = {Kind:nhd NumBlocks:4}", "set with CallerMemory"}},
	}
	if !ucx.Available {
		cases = append(cases, struct {
			name string
			edit func(*node.Config)
			want []string
		}{"receiving on auto without ucx", func(c *node.Config) { c.Backend = "" }, []string{`backend = "" (shm)`, "/dev/shm file"}})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := node.Config{Instance: "gen", Layout: tiny(), Bind: "ipc://" + t.TempDir() + "/gen.sock", Insecure: true, CallerMemory: cm}
			c.edit(&cfg)
			n, err := node.Open(context.Background(), cfg)
			if err == nil {
				_ = n.Close(context.Background())
			}
			if !errors.Is(err, node.ErrConfig) {
				t.Fatalf("Open: %v, want ErrConfig", err)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Open: %v, want it to name %q", err, w)
				}
			}
		})
	}
}
