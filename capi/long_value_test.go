package capi

import (
	"fmt"
	"strings"
	"testing"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/kvcache"
)

// TestLongConfigValueClipped: a config error quotes at most the first 64
// bytes of an over-long value, with its length (kvxfer.h), so that the
// reason after it fits in the 1023-byte message buffer. Checked to fail
// before the fix: the root package and node quoted the value whole (a
// 2000-byte model name gave a 2169-byte message on an engine, 4172 on a
// node, a bind 4159, an unknown key 2246), the reason lost past byte 1023.
func TestLongConfigValueClipped(t *testing.T) {
	long := strings.Repeat("a", 2000)
	node := `{"instance":"capi-long","model":"Llama-3.1-8B","insecure":true,"bind":"tcp://127.0.0.1:0",%s}`
	for _, c := range []struct {
		name, js string
		node     bool
		reason   string
	}{
		{"engine model", `{"model":%q}`, false, "unknown preset"},
		{"engine backend", `{"model":"Llama-3.1-8B","backend":%q}`, false, "unknown in-process backend"},
		{"engine metrics_addr", `{"model":"Llama-3.1-8B","metrics_addr":%q}`, false, "missing port in address"},
		{"engine unknown key", `{"model":"Llama-3.1-8B",%q:1}`, false, "json: unknown field"},
		{"engine layout name", `{"layout":{"name":%q,"layers":2,"kv_heads":1,"head_dim":4,"dtype_bytes":3,"tokens_per_block":4}}`, false, "is no element size"},
		{"node model", fmt.Sprintf(node, `"model":%q`), true, "unknown preset"},
		{"node bind", fmt.Sprintf(node, `"bind":%q`), true, "bind = "},
		{"node backend", fmt.Sprintf(node, `"backend":%q`), true, `want "auto"`},
		{"node metrics_addr", fmt.Sprintf(node, `"metrics_addr":%q`), true, "missing port in address"},
		{"node heartbeat_interval", fmt.Sprintf(node, `"heartbeat_interval":%q`), true, "is not a duration"},
		{"node discovery", fmt.Sprintf(node, `"discovery":%q`), true, `want "static"`},
		{"node trace_path", fmt.Sprintf(node, `"trace_path":%q`), true, "file name too long"},
		{"node unknown key", fmt.Sprintf(node, `%q:1`), true, "json: unknown field"},
		{"node peer instance", fmt.Sprintf(node, `"peers":[{"instance":%q,"endpoint":"tcp://127.0.0.1:1"}]`), true, "want 1..128 bytes"},
		{"node peer endpoint", fmt.Sprintf(node, `"peers":[{"instance":"p","endpoint":%q}]`), true, "peers[0].endpoint"},
	} {
		js := fmt.Sprintf(c.js, long)
		// "model" twice: the one given last wins in encoding/json.
		js = strings.Replace(js, `"model":"Llama-3.1-8B","insecure":true,"bind":"tcp://127.0.0.1:0","model"`, `"insecure":true,"bind":"tcp://127.0.0.1:0","model"`, 1)
		js = strings.Replace(js, `"bind":"tcp://127.0.0.1:0","bind"`, `"bind"`, 1)
		var err error
		var e *Engine
		if c.node {
			e, _, err = OpenNode(js)
		} else {
			e, _, err = Open(js, nil, 0)
		}
		if err == nil {
			_ = e.Close(0)
			t.Errorf("%s: opened", c.name)
			continue
		}
		msg := err.Error()
		if Code(err) != ErrConfig || len(msg) > 350 || !strings.Contains(msg, c.reason) ||
			!strings.Contains(msg, long[:64]) || !strings.Contains(msg, "… (2000 bytes)") || strings.Contains(msg, long[:65]) {
			t.Errorf("%s: %v, %d bytes: %.400s\nwant KVXFER_ERR_CONFIG under 350 bytes with %q and the value's first 64 bytes and length",
				c.name, Code(err), len(msg), msg, c.reason)
		}
	}
}

// TestLongGCFloorEnvClipped: a long KVXFER_GC_FLOOR (read at every open)
// is clipped as a config value is. Checked to fail before the fix: its
// 2002 bytes were quoted twice (4126 bytes).
func TestLongGCFloorEnvClipped(t *testing.T) {
	long := "lots" + strings.Repeat("x", 1998)
	t.Setenv("KVXFER_GC_FLOOR", long)
	_, err := (Config{}).engineConfig()
	if msg := fmt.Sprint(err); Code(err) != ErrConfig || len(msg) > 300 || !strings.Contains(msg, "(2002 bytes)") ||
		!strings.Contains(msg, "want a size such as 64MiB") || strings.Contains(msg, long[:65]) {
		t.Errorf("KVXFER_GC_FLOOR of 2002 bytes: %v, %d bytes: %.400s", Code(err), len(msg), msg)
	}
}

// TestShortConfigValueWhole: a value of at most 64 bytes is quoted whole,
// as before.
func TestShortConfigValueWhole(t *testing.T) {
	v := strings.Repeat("b", 64)
	_, _, err := Open(fmt.Sprintf(`{"model":%q}`, v), nil, 0)
	if err == nil || !strings.Contains(err.Error(), `unknown preset "`+v+`" (known: `) {
		t.Fatalf("%v", err)
	}
	_, _, err = OpenNode(fmt.Sprintf(`{"instance":"capi-short","model":"Llama-3.1-8B","insecure":true,"bind":%q}`, v))
	if err == nil || !strings.Contains(err.Error(), `bind = "`+v+`": `) {
		t.Fatalf("%v", err)
	}
}

// checkClipped fails t unless err is of code want (or also, when given,
// or) and its message quotes none of long whole: at most its first 64
// bytes, with its length.
func checkClipped(t *testing.T, name string, err error, want Status, long string, or ...Status) {
	t.Helper()
	msg := fmt.Sprint(err)
	code := Code(err)
	if code != want && (len(or) == 0 || code != or[0]) || strings.Contains(msg, long[:65]) || !strings.Contains(msg, long[:64]) ||
		!strings.Contains(msg, fmt.Sprintf("(%d bytes)", len(long))) {
		t.Errorf("%s: %v, %d bytes: %.600s\nwant %v quoting the value's first 64 bytes and its length, never more of it",
			name, Code(err), len(msg), msg, want)
	}
}

// TestLongNodeValueClipped: values node's messages named whole (discovery
// file names and the other etcd settings a refusal names beside its own
// field, key files, the parallelism with its stages) are clipped by
// OpenNode as every other config value. Checked to fail before the fix:
// each message held the 200-byte value whole (up to 528 bytes).
func TestLongNodeValueClipped(t *testing.T) {
	long := strings.Repeat("k", 200) // a file name that does not exist
	node := `{"instance":"capi-longnode","model":"Llama-3.1-8B","insecure":true,"bind":"tcp://127.0.0.1:0",%s}`
	for _, c := range []struct{ name, js string }{
		{"discovery_key beside an empty discovery_cert", fmt.Sprintf(node, `"discovery":"etcds://127.0.0.1:1","cluster":"c","discovery_key":%q`)},
		{"discovery_password_file without discovery_user", fmt.Sprintf(node, `"discovery":"etcd://127.0.0.1:1","cluster":"c","discovery_password_file":%q`)},
		{"discovery_ca that does not exist", fmt.Sprintf(node, `"discovery":"etcds://127.0.0.1:1","cluster":"c","discovery_ca":%q`)},
		{"discovery_password_file that does not exist", fmt.Sprintf(node, `"discovery":"etcd://127.0.0.1:1","cluster":"c","discovery_user":"u","discovery_password_file":%q`)},
		{"key_file that does not exist", `{"instance":"capi-longnode","model":"Llama-3.1-8B","bind":"tcp://127.0.0.1:0","key_file":%q}`},
		{"memory.kind of a node's own pool", fmt.Sprintf(node, `"memory":{"kind":%q,"num_blocks":4}`)},
		{"parallel.stages", fmt.Sprintf(node, `"parallel":{"tp":1,"pp":2,"stages":%q}`)},
	} {
		e, _, err := OpenNode(fmt.Sprintf(c.js, long))
		if err == nil {
			_ = e.Close(0)
			t.Errorf("%s: opened", c.name)
			continue
		}
		checkClipped(t, c.name, err, ErrConfig, long)
	}
}

// TestLongRequestIDClipped: a request id may be 256 bytes; the messages of
// the engine under capi named it whole (some twice), beyond the 64 bytes
// the header promises. Checked to fail before the fix: every case below
// quoted all 256 bytes (messages of 320 to 530 bytes).
func TestLongRequestIDClipped(t *testing.T) {
	p, d := open(t, "capi-longid-p"), open(t, "capi-longid-d")
	defer closeBoth(t, p, d)
	id := strings.Repeat("r", 256)
	_, _, err := p.Send(SendRequest{SendRequest: kvxfer.SendRequest{ID: id, PromptLen: -1}})
	checkClipped(t, "send of a negative prompt", err, ErrBadRequest, id)
	_, _, err = p.Send(SendRequest{SendRequest: kvxfer.SendRequest{ID: id, PromptLen: 32, Generation: "capi-longid-p"}})
	checkClipped(t, "send to itself", err, ErrBadRequest, id)
	_, _, err = d.Receive(ReceiveRequest{ReceiveRequest: kvxfer.ReceiveRequest{ID: id, PromptLen: 32, Context: "capi-longid-d"}})
	checkClipped(t, "receive from itself", err, ErrBadRequest, id)

	rx, _, err := d.Receive(ReceiveRequest{ReceiveRequest: kvxfer.ReceiveRequest{ID: id, PromptLen: 32, Context: "capi-longid-p"}})
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = d.Receive(ReceiveRequest{ReceiveRequest: kvxfer.ReceiveRequest{ID: id, PromptLen: 32, Context: "capi-longid-p"}})
	checkClipped(t, "receive again", err, ErrBadRequest, id)
	tx, _, err := p.Send(SendRequest{SendRequest: kvxfer.SendRequest{ID: id, PromptLen: 32}})
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = p.Send(SendRequest{SendRequest: kvxfer.SendRequest{ID: id, PromptLen: 32}})
	checkClipped(t, "send again", err, ErrBadRequest, id)
	src, err := p.AllocBlocks(0, 2)
	if err != nil {
		t.Fatal(err)
	}
	_, err = tx.Chunk(0, 10, false, []kvcache.BlockRun{{IDs: src}}, false)
	checkClipped(t, "a misaligned chunk", err, ErrBadChunk, id)
	if _, err := tx.Chunk(0, 32, true, []kvcache.BlockRun{{IDs: src}}, false); err != nil {
		t.Fatal(err)
	}
	_, err = tx.Chunk(0, 32, true, []kvcache.BlockRun{{IDs: src}}, false)
	// Once the send is DONE (at once, in process), both are refused as
	// after its outcome.
	checkClipped(t, "a chunk after the last", err, ErrBadChunk, id, ErrRequestFailed)
	checkClipped(t, "a payload after the last chunk", tx.SetPayload([]byte("late")), ErrBadRequest, id, ErrRequestFailed)
	// The refusals disturbed nothing: the request lands.
	if ev := waitFor(t, d, rx.h); ev.Outcome != OutcomeReady {
		t.Fatalf("receive: %+v", ev)
	}
	waitFor(t, p, tx.h)
	if err := rx.FreeBlocks(); err != nil {
		t.Fatal(err)
	}
	if err := p.FreeBlocks(0, src); err != nil {
		t.Fatal(err)
	}

	// A node refuses its own instance as the context before the engine
	// does (capi names it), the id clipped as well.
	n, _, err := OpenNode(`{"instance":"capi-longid-node","model":"Llama-3.1-8B","tokens_per_block":16,"pool_bytes":4194304,` +
		`"backend":"shm","workers":2,"bind":"tcp://127.0.0.1:0","insecure":true}`)
	if err != nil {
		t.Fatal(err)
	}
	defer closeBoth(t, n)
	_, _, err = n.Receive(ReceiveRequest{ReceiveRequest: kvxfer.ReceiveRequest{ID: id, PromptLen: 32, Context: "capi-longid-node"}})
	checkClipped(t, "a node's receive from itself", err, ErrBadRequest, id)
	if !strings.Contains(fmt.Sprint(err), `Context "capi-longid-node" is this engine itself`) {
		t.Errorf("a node's receive from itself: %v, want the context named", err)
	}
}
