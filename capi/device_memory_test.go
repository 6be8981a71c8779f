package capi

import (
	"context"
	"fmt"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma/ucx"
)

// fakeDeviceBase is where deviceMemoryJSON's tensors start: an address no
// host mapping of the test process has, so a CPU copy through it would
// fault instead of passing unseen. Nothing in these tests may touch it.
const fakeDeviceBase = 1 << 40

// deviceMemoryJSON is memoryJSON's NHD object for tensors at
// fakeDeviceBase, with extra keys (`,"device":0`) after layers.
func deviceMemoryJSON(extra string) string {
	var addrs []string
	for i := range memLayers {
		addrs = append(addrs, fmt.Sprint(fakeDeviceBase+64+uint64(i)*(memTensor+128)))
	}
	return fmt.Sprintf(`{"kind":"nhd","num_blocks":%d,"layers":[%s]%s}`, memBlocks, strings.Join(addrs, ","), extra)
}

// poolJSON is a node config of tinyLayout over the caller's pool at
// fakeDeviceBase (pool_address, pool_bytes); extra is more keys.
func poolJSON(dir, backend, extra string) string {
	return fmt.Sprintf(`{"instance":"dm-pool",%s,"insecure":true,"backend":%q,"bind":"ipc://%s","pool_address":%d,"pool_bytes":65536%s}`,
		tinyLayout, backend, filepath.Join(dir, "pool.sock"), uint64(fakeDeviceBase), extra)
}

// TestDeviceMemoryForms: "memory" with "device" describes the same tensors
// as the host form (the same descriptors, the region's base and length),
// as a DeviceMem region of that ordinal; "pool_device" does the same for
// "pool_address". (Checked to fail: with describe and nodeConfig ignoring
// the ordinal, the regions are HostMem.)
func TestDeviceMemoryForms(t *testing.T) {
	dir := t.TempDir()
	parse := func(js string) node0 {
		t.Helper()
		cfg, err := nodeConfig(js)
		if err != nil {
			t.Fatalf("%s: %v", js, err)
		}
		if cfg.CallerMemory == nil || cfg.CallerMemory.Region == nil {
			t.Fatalf("%s: no caller memory", js)
		}
		return node0{cfg.CallerMemory.Region, cfg.CallerMemory.Memory}
	}
	for _, c := range []struct {
		host, dev string
		ordinal   int
		base      uintptr // the lowest tensor's address, or the pool's
	}{
		{nodeMemJSON(dir, "dm-a", "dm-b", "ucx", deviceMemoryJSON(""), ""),
			nodeMemJSON(dir, "dm-a", "dm-b", "ucx", deviceMemoryJSON(`,"device":3`), ""), 3, fakeDeviceBase + 64},
		{nodeMemJSON(dir, "dm-a", "dm-b", "ucx", deviceMemoryJSON(`,"device":null`), ""),
			nodeMemJSON(dir, "dm-a", "dm-b", "ucx", deviceMemoryJSON(`,"device":0`), ""), 0, fakeDeviceBase + 64},
		{poolJSON(dir, "ucx", ""), poolJSON(dir, "ucx", `,"pool_device":2`), 2, fakeDeviceBase},
	} {
		h, d := parse(c.host), parse(c.dev)
		if h.r.Kind != kvcache.HostMem {
			t.Errorf("%s: region %v, want host memory", c.host, h.r.Kind)
		}
		if d.r.Kind != kvcache.DeviceMem || d.r.Device != c.ordinal {
			t.Errorf("%s: region %v on device %d, want device memory on device %d", c.dev, d.r.Kind, d.r.Device, c.ordinal)
		}
		if d.r.Base != h.r.Base || d.r.Len != h.r.Len || d.r.Base != c.base {
			t.Errorf("%s: region at %#x of %d bytes, the host form's at %#x of %d", c.dev, d.r.Base, d.r.Len, h.r.Base, h.r.Len)
		}
		if d.r.Bytes() != nil {
			t.Errorf("%s: a device region has host bytes", c.dev)
		}
		if !reflect.DeepEqual(d.m, h.m) {
			t.Errorf("%s: descriptors %+v, the host form's %+v", c.dev, d.m, h.m)
		}
	}
}

type node0 struct {
	r *kvcache.Region
	m []*kvcache.KVMemory
}

// TestDeviceMemoryBadOrdinals: a device ordinal that is negative, not an
// integer, a string or out of range is a config error naming the key and
// the value, and so are the keys where they describe nothing. (Checked to
// fail: with cudaOrdinal taking any number, -1 and 1.5 pass on.)
func TestDeviceMemoryBadOrdinals(t *testing.T) {
	dir := t.TempDir()
	for _, v := range []string{"-1", "1.5", `"0"`, "2147483648", "true", "[0]"} {
		for _, js := range []struct{ js, needle string }{
			{nodeMemJSON(dir, "dm-a", "dm-b", "ucx", deviceMemoryJSON(`,"device":`+v), ""), "memory.device = " + v + ": want the CUDA device ordinal"},
			{poolJSON(dir, "ucx", `,"pool_device":`+v), "pool_device = " + v + ": want the CUDA device ordinal"},
		} {
			_, err := nodeConfig(js.js)
			if Code(err) != ErrConfig || !strings.Contains(err.Error(), js.needle) {
				t.Errorf("%s: %v, want a config error naming %q", js.js, err, js.needle)
			}
		}
	}
	for _, c := range []struct{ js, needle string }{
		{fmt.Sprintf(`{"instance":"dm-a",%s,"insecure":true,"pool_bytes":65536,"pool_device":0}`, tinyLayout), "pool_device = 0 without pool_address"},
		{fmt.Sprintf(`{"instance":"dm-a",%s,"insecure":true,"memory":{"kind":"nhd","num_blocks":8,"device":1}}`, tinyLayout), "memory.device = 1 without memory.layers"},
	} {
		if _, err := nodeConfig(c.js); Code(err) != ErrConfig || !strings.Contains(err.Error(), c.needle) {
			t.Errorf("%s: %v, want a config error naming %q", c.js, err, c.needle)
		}
	}
}

// TestEngineRefusesDeviceMemory: kvxfer_engine_open's in-process engine
// copies with the CPU: GPU memory ("memory" with "device", "pool_device")
// is refused by name, saying to open a node, and nothing stays open.
// (Checked to fail: without Open's refusal, the engine's open fails only
// in the loopback agent's Register, an error that names neither the key
// nor what to do.) Below capi, kvxfer.Start over a device region fails at
// the loopback agent's Register (the region has no host bytes to copy):
// the CPU never copies through a device address.
func TestEngineRefusesDeviceMemory(t *testing.T) {
	base := HandleCount()
	for _, c := range []struct{ js, needle string }{
		{fmt.Sprintf(`{"instance":"dm-eng",%s,"workers":2,"memory":%s}`, tinyLayout, deviceMemoryJSON(`,"device":0`)), "memory.device = 0: the in-process engine"},
		{fmt.Sprintf(`{"instance":"dm-eng",%s,"workers":2,"pool_device":1}`, tinyLayout), "pool_device = 1: the in-process engine"},
	} {
		_, _, err := Open(c.js, nil, 0)
		if Code(err) != ErrConfig || !strings.Contains(err.Error(), c.needle) ||
			!strings.Contains(err.Error(), "open a node (kvxfer_node_open)") || !strings.Contains(err.Error(), `"cudaipc"`) {
			t.Errorf("%s: %v, want a config error naming %q and what to open instead", c.js, err, c.needle)
		}
	}
	// A bad ordinal is named before anything else.
	js := fmt.Sprintf(`{"instance":"dm-eng",%s,"memory":%s}`, tinyLayout, deviceMemoryJSON(`,"device":-2`))
	if _, _, err := Open(js, nil, 0); Code(err) != ErrConfig || !strings.Contains(err.Error(), "memory.device = -2") {
		t.Errorf("%s: %v", js, err)
	}
	js = fmt.Sprintf(`{"instance":"dm-eng",%s,"pool_device":"1"}`, tinyLayout)
	if _, _, err := Open(js, nil, 0); Code(err) != ErrConfig || !strings.Contains(err.Error(), `pool_device = "1": want the CUDA device ordinal`) {
		t.Errorf("%s: %v", js, err)
	}
	// "pool_device": null is host memory, as kvxfer_node_open reads it.
	js = fmt.Sprintf(`{"instance":"dm-eng-null",%s,"workers":2,"pool_device":null}`, tinyLayout)
	if e, _, err := Open(js, nil, 0); err != nil {
		t.Errorf("%s: %v, want an engine over host memory", js, err)
	} else if err := e.Close(10 * time.Second); err != nil {
		t.Error(err)
	}
	// Below capi's refusal: the root engine over the same device region.
	c, err := ParseConfig(fmt.Sprintf(`{"instance":"dm-eng-raw",%s,"workers":2,"memory":%s}`, tinyLayout, deviceMemoryJSON(`,"device":0`)))
	if err != nil {
		t.Fatal(err)
	}
	kc, err := c.engineConfig()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Memory.describe(&kc); err != nil {
		t.Fatal(err)
	}
	if kc.Region.Kind != kvcache.DeviceMem {
		t.Fatalf("region %v", kc.Region.Kind)
	}
	if eng, err := kvxfer.Start(context.Background(), kc); err == nil {
		_ = eng.Close(context.Background())
		t.Fatal("the in-process engine started over device memory")
	} else if !strings.Contains(err.Error(), "only host memory can be copied") {
		t.Errorf("kvxfer.Start over device memory: %v", err)
	}
	if n := HandleCount(); n != base {
		t.Fatalf("%d handles left, want %d", n, base)
	}
}

// TestNodeDeviceMemoryBackends: a node over GPU memory needs a data plane
// that reaches it. On shm and loopback it is refused naming the backend;
// on ucx without CUDA (this machine's UCX, when it has none) node.Open
// refuses it naming the memory types UCX registers. Nothing stays open,
// and nothing touches the (fake) device address. (Checked to fail: with
// nodeConfig's region left host memory, shm send_only and loopback open.)
func TestNodeDeviceMemoryBackends(t *testing.T) {
	base := HandleCount()
	dir := t.TempDir()
	mem := deviceMemoryJSON(`,"device":0`)
	type tc struct{ js, needle string }
	cases := []tc{
		{nodeMemJSON(dir, "dm-a", "dm-b", "shm", mem, ""), `backend = "shm"`},
		{nodeMemJSON(dir, "dm-a", "dm-b", "shm", mem, `,"send_only":true`), `backend = "shm"`},
		{nodeMemJSON(dir, "dm-a", "dm-b", "loopback", mem, ""), `backend = "loopback"`},
		{nodeMemJSON(dir, "dm-a", "dm-b", "loopback", mem, `,"send_only":true`), `backend = "loopback"`},
		{poolJSON(dir, "loopback", `,"pool_device":0`), `backend = "loopback"`},
	}
	for i := range cases {
		cases[i].needle += ": the framework's memory is GPU memory (device 0)"
	}
	if ucx.Available {
		if a, err := ucx.New(); err != nil {
			t.Logf("ucx: %v: its case skipped", err)
		} else {
			types := a.MemoryTypes()
			_ = a.Close()
			if slices.Contains(types, "cuda") {
				t.Logf("this UCX registers %v: the refusal of device memory on ucx is not this machine's behaviour", types)
			} else {
				needle := fmt.Sprintf("backend = \"ucx\": the framework's memory is GPU memory (device 0 at %#x", fakeDeviceBase+64)
				cases = append(cases,
					tc{nodeMemJSON(dir, "dm-a", "dm-b", "ucx", mem, ""), needle},
					tc{nodeMemJSON(dir, "dm-a", "dm-b", "ucx", mem, ""), fmt.Sprintf("this UCX has no CUDA support (it registers: %v)", types)},
					tc{nodeMemJSON(dir, "dm-a", "dm-b", "ucx", mem, `,"send_only":true`), needle},
					tc{poolJSON(dir, "ucx", `,"pool_device":0`), fmt.Sprintf("GPU memory (device 0 at %#x, 65536 bytes)", fakeDeviceBase)})
			}
		}
	}
	for _, c := range cases {
		e, _, err := OpenNode(c.js)
		if err == nil {
			_ = e.Close(0)
			t.Errorf("%s: opened", c.js)
			continue
		}
		t.Log(err)
		if Code(err) != ErrConfig || !strings.Contains(err.Error(), c.needle) {
			t.Errorf("%s: %v, want a config error naming %q", c.js, err, c.needle)
		}
	}
	if n := HandleCount(); n != base {
		t.Fatalf("%d handles left, want %d", n, base)
	}
}

// TestDeviceMemoryPicksTheNodesGPU: on backend cudaipc a node over GPU
// memory runs on that memory's GPU when the config names none (one config
// serves every rank of an instance, each on its own GPU), in both memory
// forms; a "device" given is kept (Open then refuses a mismatch), and
// other backends keep device 0. (Checked to fail: without the default,
// the node is on device 0 for memory on device 3.)
func TestDeviceMemoryPicksTheNodesGPU(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		js   string
		want int
	}{
		{nodeMemJSON(dir, "dm-a", "dm-b", "cudaipc", deviceMemoryJSON(`,"device":3`), ""), 3},
		{poolJSON(dir, "cudaipc", `,"pool_device":2`), 2},
		{poolJSON(dir, "cudaipc", `,"pool_device":2,"device":1`), 1},
		{nodeMemJSON(dir, "dm-a", "dm-b", "ucx", deviceMemoryJSON(`,"device":3`), ""), 0},
	} {
		cfg, err := nodeConfig(c.js)
		if err != nil {
			t.Fatalf("%s: %v", c.js, err)
		}
		if cfg.Device != c.want {
			t.Errorf("%s: node device %d, want %d", c.js, cfg.Device, c.want)
		}
	}
}
