package capi

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"unsafe"

	"github.com/kvxfer/kvxfer/rdma/ucx"
)

// nodeMemJSON is a node config of tinyLayout over the framework's tensors
// (mem, memoryJSON's object): insecure, bound at dir/self.sock, its one
// peer at dir/peer.sock; extra is more keys (",\"send_only\":true").
func nodeMemJSON(dir, self, peer, backend, mem, extra string) string {
	return fmt.Sprintf(`{"instance":%q,%s,"workers":2,"backend":%q,"insecure":true,"bind":"ipc://%s",`+
		`"peers":[{"instance":%q,"endpoint":"ipc://%s"}],"heartbeat_interval":"200ms","memory":%s%s}`,
		self, tinyLayout, backend, filepath.Join(dir, self+".sock"), peer, filepath.Join(dir, peer+".sock"), mem, extra)
}

// TestNodeOverFrameworkMemoryFromJSON: two nodes opened from JSON over
// ucx, each over tensors its framework allocated ("memory" with "layers":
// NHD with PyTorch's strides on the send-only context side, HND on the
// generation side), move a request into the framework's block ids; every
// byte lands where the generation side's tensors hold it. (Checked to
// fail: with nodeConfig dropping the "memory" object instead of making it
// the node's CallerMemory, the node opens a pool of its own and the
// tensors stay zero.)
func TestNodeOverFrameworkMemoryFromJSON(t *testing.T) {
	if !ucx.Available {
		t.Skip("a receiving node over the framework's memory needs ucx, which this build lacks")
	}
	base := HandleCount()
	dir := t.TempDir()
	srcBuf, dstBuf := hostBuf(t), hostBuf(t)
	d, _, err := OpenNode(nodeMemJSON(dir, "nm-gen", "nm-ctx", "ucx", memoryJSON(dstBuf, "hnd", ""), ""))
	if err != nil {
		t.Fatal(err)
	}
	p, _, err := OpenNode(nodeMemJSON(dir, "nm-ctx", "nm-gen", "ucx", memoryJSON(srcBuf, "nhd", nhdStrides()), `,"send_only":true`))
	if err != nil {
		t.Fatal(err)
	}
	if err := d.WaitPeers(10 * 1e9); err != nil {
		t.Fatal(err)
	}
	moveIntoFramework(t, p, d, srcBuf, dstBuf, "nm", "nm-ctx")
	if n := HandleCount(); n != base {
		t.Fatalf("%d handles left, want %d", n, base)
	}
}

// TestNodeFrameworkMemoryErrors: a node's "memory" with tensor addresses,
// and what cannot run over it, are refused as config errors naming the key
// or the backend; nothing stays open. (Checked to fail: with nodeConfig
// decoding "memory" leniently, the unknown key opens.)
func TestNodeFrameworkMemoryErrors(t *testing.T) {
	base := HandleCount()
	dir := t.TempDir()
	buf := hostBuf(t)
	good := memoryJSON(buf, "nhd", "")
	for _, c := range []struct{ backend, mem, extra, needle string }{
		{"shm", good, "", `backend = "shm": a receiving node over the framework's memory`},
		{"shm", good, "", `use backend "ucx"`},
		{"shm", strings.Replace(good, `"layers"`, `"layerz":1,"layers"`, 1), `,"send_only":true`, `memory: json: unknown field "layerz"`},
		{"shm", strings.Replace(good, `"nhd"`, `"nchw"`, 1), `,"send_only":true`, `memory.kind = "nchw"`},
		{"shm", strings.Replace(good, `"num_blocks":8`, `"num_blocks":0`, 1), `,"send_only":true`, "memory.num_blocks = 0"},
		{"shm", strings.Replace(good, `"layers"`, `"dtype_bytes":4,"layers"`, 1), `,"send_only":true`, "memory.dtype_bytes = 4"},
		{"shm", good, `,"send_only":true,"revoke_spare_bytes":65536`, "revoke_spare_bytes = 65536"},
		{"shm", good, `,"send_only":true,"model":"Llama-3.1-8B"`, `layout and model = "Llama-3.1-8B": give one`},
		{"shm", good, `,"send_only":true,"pool_bytes":4096`, "pool_bytes = 4096"},
		{"shm", good, `,"send_only":true,"pool_address":4096`, "pool_address and memory: give one"},
	} {
		_, _, err := OpenNode(nodeMemJSON(dir, "nm-bad", "nm-peer", c.backend, c.mem, c.extra))
		if Code(err) != ErrConfig || !strings.Contains(err.Error(), c.needle) {
			t.Errorf("backend %s memory %s%s: %v, want a config error naming %q", c.backend, c.mem, c.extra, err, c.needle)
		}
	}
	// The caller's pool by address (pool_address): without its length, and
	// on shm for a receiving node.
	pool := fmt.Sprint(uintptr(unsafe.Pointer(&buf[0])))
	for _, c := range []struct{ extra, needle string }{
		{`"pool_address":` + pool, "without pool_bytes"},
		{`"pool_address":0,"pool_bytes":4096`, "pool_address = 0"},
		{`"pool_address":` + pool + `,"pool_bytes":4096,"backend":"shm"`, `backend = "shm": a receiving node`},
	} {
		js := fmt.Sprintf(`{"instance":"nm-pool",%s,"insecure":true,"bind":"ipc://%s",%s}`, tinyLayout, filepath.Join(dir, "pool.sock"), c.extra)
		if _, _, err := OpenNode(js); Code(err) != ErrConfig || !strings.Contains(err.Error(), c.needle) {
			t.Errorf("%s: %v, want a config error naming %q", js, err, c.needle)
		}
	}
	if n := HandleCount(); n != base {
		t.Fatalf("%d handles left, want %d", n, base)
	}
}

// TestNodePoolAddressClipped: a pool_address that is no address, 5,000
// bytes long, is refused with a message that shows its start and still
// ends with the reason (kvxfer_last_error keeps 1,023 bytes). (Checked to
// fail: the message quoted the whole value, and the C caller's copy lost
// the reason.)
func TestNodePoolAddressClipped(t *testing.T) {
	long := `"` + strings.Repeat("x", 5000) + `"`
	js := fmt.Sprintf(`{"instance":"nm-clip",%s,"insecure":true,"pool_bytes":4096,"pool_address":%s}`, tinyLayout, long)
	_, _, err := OpenNode(js)
	if Code(err) != ErrConfig {
		t.Fatalf("pool_address of 5002 bytes: %v, want ErrConfig", err)
	}
	msg := err.Error()
	if len(msg) > 400 || !strings.Contains(msg, `pool_address = "xxx`) || !strings.Contains(msg, "want the address of the caller's pool") {
		t.Errorf("message of %d bytes: %.500s; want the value's start and the reason, in at most 400 bytes", len(msg), msg)
	}
}
