package capi

import (
	"fmt"
	"strings"
	"testing"
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
