package capi

import (
	"fmt"
	"math"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestHugeTimeoutMsRefused: transfer_timeout_ms and drain_grace_ms past
// what a time.Duration holds (about 292 years) are refused naming the
// value and the bound, instead of wrapping to a timeout of microseconds
// (or 0, the default); the bound itself is taken.
func TestHugeTimeoutMsRefused(t *testing.T) {
	const maxMs = int64(math.MaxInt64 / int64(time.Millisecond))
	for _, tc := range []struct {
		field string
		set   func(c *Config, ms int64)
	}{
		{"transfer_timeout_ms", func(c *Config, ms int64) { c.TransferTimeoutMs = ms }},
		{"drain_grace_ms", func(c *Config, ms int64) { c.DrainGraceMs = ms }},
	} {
		for _, ms := range []int64{maxMs + 1, 18446744073710, 1 << 62} {
			c, err := ParseConfig(`{"model":"Llama-3.1-8B","pool_bytes":1048576}`)
			if err != nil {
				t.Fatal(err)
			}
			tc.set(&c, ms)
			if _, err := c.engineConfig(); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%s = %d", tc.field, ms)) {
				t.Errorf("%s = %d: %v, want a refusal naming it", tc.field, ms, err)
			}
		}
		c, err := ParseConfig(`{"model":"Llama-3.1-8B","pool_bytes":1048576}`)
		if err != nil {
			t.Fatal(err)
		}
		tc.set(&c, maxMs)
		kc, err := c.engineConfig()
		if err != nil {
			t.Fatalf("%s = %d (the bound): %v", tc.field, maxMs, err)
		}
		if kc.TransferTimeout < 0 || kc.DrainGrace < 0 || max(kc.TransferTimeout, kc.DrainGrace) < 290*365*24*time.Hour {
			t.Fatalf("%s = %d: TransferTimeout %v, DrainGrace %v", tc.field, maxMs, kc.TransferTimeout, kc.DrainGrace)
		}
	}
}

// TestPoolBytesDisagreeingRefused: kvxfer_engine_open's pool_bytes
// argument with no pool (the engine allocates it) and a config's
// pool_bytes that says another size is refused naming both, as it is
// with a pool, instead of taking the config's silently; the same size,
// or either one alone, opens. (Checked to fail: the engine opened with
// the config's 64 KiB pool though 128 KiB were passed.)
func TestPoolBytesDisagreeingRefused(t *testing.T) {
	cfg := func(instance string, poolBytes int) string {
		return fmt.Sprintf(`{"instance":%q,%s,"pool_bytes":%d,"workers":2}`, instance, tinyLayout, poolBytes)
	}
	if e, _, err := Open(cfg("capi-pb-bad", 65536), nil, 131072); Code(err) != ErrConfig ||
		!strings.Contains(err.Error(), "pool_bytes = 65536") || !strings.Contains(err.Error(), "131072") {
		if e != nil {
			_ = e.Close(5 * time.Second)
		}
		t.Fatalf("config pool_bytes 65536, argument 131072: %v, want ErrConfig naming both", err)
	}
	for _, c := range []struct {
		cfg  string
		arg  uint64
		want uint64
	}{
		{cfg("capi-pb-same", 65536), 65536, 65536},
		{cfg("capi-pb-cfg", 65536), 0, 65536},
		{fmt.Sprintf(`{"instance":"capi-pb-arg",%s,"workers":2}`, tinyLayout), 131072, 131072},
	} {
		e, _, err := Open(c.cfg, nil, c.arg)
		if err != nil {
			t.Fatalf("%s with pool_bytes %d: %v", c.cfg, c.arg, err)
		}
		got := e.Info().PoolBytes
		if err := e.Close(5 * time.Second); err != nil {
			t.Fatal(err)
		}
		if got != c.want {
			t.Errorf("%s with pool_bytes %d: a pool of %d bytes, want %d", c.cfg, c.arg, got, c.want)
		}
	}
}

// TestOpenResourceErrorsAreConfig: kvxfer_engine_open of an instance name
// another engine of the process already listens as, or with a
// metrics_addr it cannot listen on, is the caller's config, not a bug in
// kvxfer: KVXFER_ERR_CONFIG naming the value, as kvxfer_node_open says
// the same mistakes (nodeError), not KVXFER_ERR_INTERNAL.
func TestOpenResourceErrorsAreConfig(t *testing.T) {
	first := open(t, "capi-dup")
	defer func() { _ = first.Close(5 * time.Second) }()
	if e, _, err := Open(`{"instance":"capi-dup",`+tinyLayout+`,"pool_bytes":65536,"workers":2}`, nil, 0); Code(err) != ErrConfig ||
		!strings.Contains(err.Error(), "capi-dup") {
		if e != nil {
			_ = e.Close(5 * time.Second)
		}
		t.Fatalf("a second engine named capi-dup: %v (%s), want ErrConfig naming the instance", err, Code(err))
	}
	p, _, err := Open(`{"instance":"capi-dup-m1",`+tinyLayout+`,"pool_bytes":65536,"workers":2,"metrics_addr":"127.0.0.1:0"}`, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = p.Close(5 * time.Second) }()
	addr := p.Inner().MetricsAddr()
	if e, _, err := Open(fmt.Sprintf(`{"instance":"capi-dup-m2",%s,"pool_bytes":65536,"workers":2,"metrics_addr":%q}`, tinyLayout, addr), nil, 0); Code(err) != ErrConfig ||
		!strings.Contains(err.Error(), addr) {
		if e != nil {
			_ = e.Close(5 * time.Second)
		}
		t.Fatalf("metrics_addr %s in use: %v (%s), want ErrConfig naming it", addr, err, Code(err))
	}
}

// TestNegativeLayersRefused: a layout of layers -1 (and no groups), of
// an engine or a node, is refused as ErrConfig naming the value, as 0 is, not a panic in
// building its full-attention group (KVXFER_ERR_INTERNAL with a
// goroutine dump through the C ABI).
func TestNegativeLayersRefused(t *testing.T) {
	for _, n := range []int{-1, -1 << 40} {
		js := fmt.Sprintf(`{"instance":"capi-neg-layers","layout":{"layers":%d,"kv_heads":2,"head_dim":8,"dtype_bytes":2,"tokens_per_block":16},"pool_bytes":65536,"workers":2}`, n)
		e, _, err := Open(js, nil, 0)
		if e != nil {
			_ = e.Close(5 * time.Second)
		}
		if Code(err) != ErrConfig || !strings.Contains(err.Error(), fmt.Sprintf("Layers = %d", n)) {
			t.Fatalf("layers %d: %v (%s), want ErrConfig naming it", n, err, Code(err))
		}
		// kvxfer_node_open reads the same layout.
		e, _, err = OpenNode(fmt.Sprintf(`{"instance":"capi-neg-layers-node","insecure":true,"bind":"tcp://127.0.0.1:0","layout":{"layers":%d,"kv_heads":2,"head_dim":8,"dtype_bytes":2,"tokens_per_block":16}}`, n))
		if e != nil {
			_ = e.Close(5 * time.Second)
		}
		if Code(err) != ErrConfig || !strings.Contains(err.Error(), fmt.Sprintf("Layers = %d", n)) {
			t.Fatalf("node, layers %d: %v (%s), want ErrConfig naming it", n, err, Code(err))
		}
	}
}

// TestHugeLayersRefused: a layout of more layers than any model has (and
// no groups), of an engine or a node, is refused as ErrConfig naming the
// value before its full-attention group is built: building it took 8
// bytes a layer first, and a config of "layers": 100000000000 ended the
// caller's process (the Go runtime's fatal out of memory, SIGABRT) inside
// kvxfer_engine_open or kvxfer_node_open.
func TestHugeLayersRefused(t *testing.T) {
	// 2^26 layers: half a GiB of group before the check, enough to tell;
	// 10^11: 800 GB, the abort, once the first passed.
	for _, n := range []int{1 << 26, 100_000_000_000} {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		js := fmt.Sprintf(`{"instance":"capi-huge-layers","layout":{"layers":%d,"kv_heads":2,"head_dim":8,"dtype_bytes":2,"tokens_per_block":16},"pool_bytes":65536,"workers":2}`, n)
		e, _, err := Open(js, nil, 0)
		if e != nil {
			_ = e.Close(5 * time.Second)
		}
		runtime.ReadMemStats(&after)
		if got := after.TotalAlloc - before.TotalAlloc; got > 16<<20 {
			t.Fatalf("layers %d: %d bytes allocated to refuse it", n, got)
		}
		if Code(err) != ErrConfig || !strings.Contains(err.Error(), fmt.Sprintf("Layers = %d", n)) {
			t.Fatalf("layers %d: %v (%s), want ErrConfig naming it", n, err, Code(err))
		}
		// kvxfer_node_open reads the same layout.
		runtime.ReadMemStats(&before)
		e, _, err = OpenNode(fmt.Sprintf(`{"instance":"capi-huge-layers-node","insecure":true,"bind":"tcp://127.0.0.1:0","layout":{"layers":%d,"kv_heads":2,"head_dim":8,"dtype_bytes":2,"tokens_per_block":16}}`, n))
		if e != nil {
			_ = e.Close(5 * time.Second)
		}
		runtime.ReadMemStats(&after)
		if got := after.TotalAlloc - before.TotalAlloc; got > 16<<20 {
			t.Fatalf("node, layers %d: %d bytes allocated to refuse it", n, got)
		}
		if Code(err) != ErrConfig || !strings.Contains(err.Error(), fmt.Sprintf("Layers = %d", n)) {
			t.Fatalf("node, layers %d: %v (%s), want ErrConfig naming it", n, err, Code(err))
		}
	}
}

// TestConfigInvalidUTF8Refused: a config JSON that is not UTF-8 is
// refused naming where, for an engine and a node. encoding/json replaced
// each bad byte with U+FFFD: "instance":"ctx-\xff" opened an engine named
// "ctx-\uFFFD", which a request naming the instance as the caller spells
// it (kvxfer_receive's context, copied as given) never found.
func TestConfigInvalidUTF8Refused(t *testing.T) {
	js := `{"instance":"capi-utf8-` + "\xff" + `",` + tinyLayout + `,"pool_bytes":65536,"workers":2}`
	e, _, err := Open(js, nil, 0)
	if e != nil {
		_ = e.Close(5 * time.Second)
		t.Fatalf("opened as instance %q", e.instance)
	}
	if Code(err) != ErrConfig || !strings.Contains(err.Error(), "not valid UTF-8: byte 23") {
		t.Fatalf("%v (%s), want ErrConfig naming the byte", err, Code(err))
	}
	e, _, err = OpenNode(`{"instance":"capi-utf8-node-` + "\xff" + `","insecure":true,"bind":"tcp://127.0.0.1:0",` + tinyLayout + `}`)
	if e != nil {
		_ = e.Close(5 * time.Second)
		t.Fatalf("node opened as instance %q", e.instance)
	}
	if Code(err) != ErrConfig || !strings.Contains(err.Error(), "not valid UTF-8: byte 28") {
		t.Fatalf("node: %v (%s), want ErrConfig naming the byte", err, Code(err))
	}
}

// TestSecondEngineOfAnInstanceSaysSo: a second engine of an instance and
// rank already open in the process was refused as "control: already
// listening: capi-dup2/0", naming neither the cause nor what to do; it
// now says the instance and rank are already open in this process.
func TestSecondEngineOfAnInstanceSaysSo(t *testing.T) {
	first := open(t, "capi-dup2")
	defer func() { _ = first.Close(5 * time.Second) }()
	e, _, err := Open(`{"instance":"capi-dup2",`+tinyLayout+`,"pool_bytes":65536,"workers":2}`, nil, 0)
	if e != nil {
		_ = e.Close(5 * time.Second)
	}
	if Code(err) != ErrConfig || !strings.Contains(err.Error(), `instance "capi-dup2" rank tp0/pp0 is already open in this process`) {
		t.Fatalf("a second engine named capi-dup2: %v (%s), want ErrConfig saying it is already open", err, Code(err))
	}
}

// TestDTypeBytesOutsideElementSizesRefused: a layout's dtype_bytes of 3 was
// taken by kvxfer_engine_open and kvxfer_node_open alike (blocks laid out
// at 3 bytes an element); both now refuse it as ErrConfig naming the value
// and the accepted set. Checked to fail without the fix.
func TestDTypeBytesOutsideElementSizesRefused(t *testing.T) {
	want := []string{"DTypeBytes = 3", "[1 2 4 8]"}
	e, _, err := Open(`{"instance":"capi-dtype3","layout":{"layers":4,"kv_heads":2,"head_dim":8,"dtype_bytes":3,"tokens_per_block":16},"pool_bytes":1048576,"workers":2}`, nil, 0)
	if e != nil {
		_ = e.Close(5 * time.Second)
	}
	if Code(err) != ErrConfig || !strings.Contains(err.Error(), want[0]) || !strings.Contains(err.Error(), want[1]) {
		t.Fatalf("engine, dtype_bytes 3: %v (%s), want ErrConfig naming %q", err, Code(err), want)
	}
	e, _, err = OpenNode(`{"instance":"capi-dtype3-node","insecure":true,"bind":"tcp://127.0.0.1:0","pool_bytes":1048576,"layout":{"layers":4,"kv_heads":2,"head_dim":8,"dtype_bytes":3,"tokens_per_block":16}}`)
	if e != nil {
		_ = e.Close(5 * time.Second)
	}
	if Code(err) != ErrConfig || !strings.Contains(err.Error(), want[0]) || !strings.Contains(err.Error(), want[1]) {
		t.Fatalf("node, dtype_bytes 3: %v (%s), want ErrConfig naming %q", err, Code(err), want)
	}
}
