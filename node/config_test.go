package node_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/node"
	"github.com/kvxfer/kvxfer/rdma/shm"
	"github.com/kvxfer/kvxfer/rdma/ucx"
)

// goodJSON is a complete, valid config as a C caller would pass it.
const goodJSON = `{
  "instance": "gen", "parallel": {"tp": 2, "pp": 1}, "rank": {"tp": 1, "pp": 0},
  "model": "Llama-3.1-8B", "tokens_per_block": 32, "pool_bytes": 1073741824, "workers": 4,
  "backend": "shm", "bind": "tcp://10.0.0.2:5601",
  "peers": [
    {"instance": "ctx", "parallel": {"tp": 2, "pp": 1}, "rank": {"tp": 0, "pp": 0},
     "endpoint": "tcp://10.0.0.1:5600", "public_key_file": "ctx0.pub"},
    {"instance": "ctx", "parallel": {"tp": 2, "pp": 1}, "rank": {"tp": 1, "pp": 0},
     "endpoint": "tcp://10.0.0.1:5610", "public_key_file": "ctx1.pub"}
  ],
  "key_file": "gen1.key",
  "identities": [{"public_key_file": "router.pub", "instance": "router"}],
  "heartbeat_interval": "500ms", "heartbeat_misses": 4,
  "transfer_timeout": "30s", "drain_grace": "2s",
  "metrics_addr": "127.0.0.1:9465", "trace_path": "gen1.trace", "trace_max_bytes": 67108864, "trace_keep": 3
}`

// TestParseConfigReadsEveryField: every snake_case name lands in its field
// and a marshalled Config parses back to itself.
func TestParseConfigReadsEveryField(t *testing.T) {
	c, err := node.ParseConfig([]byte(goodJSON))
	if err != nil {
		t.Fatal(err)
	}
	if c.Instance != "gen" || c.Parallel != (node.Parallel{TP: 2, PP: 1}) || c.Rank != (node.Rank{TP: 1}) ||
		c.TokensPerBlock != 32 || c.PoolBytes != 1<<30 || len(c.Peers) != 2 || c.Peers[1].Rank.TP != 1 ||
		c.Peers[1].Endpoint != "tcp://10.0.0.1:5610" || c.KeyFile != "gen1.key" || c.Identities[0].Instance != "router" ||
		time.Duration(c.HeartbeatInterval) != 500*time.Millisecond || c.HeartbeatMisses != 4 ||
		time.Duration(c.TransferTimeout) != 30*time.Second || c.MetricsAddr != "127.0.0.1:9465" || c.TracePath != "gen1.trace" ||
		c.TraceMaxBytes != 64<<20 || c.TraceKeep != 3 {
		t.Fatalf("parsed %+v", c)
	}
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	again, err := node.ParseConfig(b)
	if err != nil {
		t.Fatalf("a marshalled config does not parse: %v\n%s", err, b)
	}
	if !reflect.DeepEqual(again, c) {
		t.Fatalf("round trip changed the config:\n%+v\n%+v", c, again)
	}
}

// TestParseConfigNamesBadValues: each bad value is refused with ErrConfig
// and a message naming the field and the value.
func TestParseConfigNamesBadValues(t *testing.T) {
	set := func(patch string) string {
		var m map[string]any
		if err := json.Unmarshal([]byte(goodJSON), &m); err != nil {
			t.Fatal(err)
		}
		var p map[string]any
		if err := json.Unmarshal([]byte(patch), &p); err != nil {
			t.Fatal(err)
		}
		for k, v := range p {
			if v == nil {
				delete(m, k)
			} else {
				m[k] = v
			}
		}
		b, _ := json.Marshal(m)
		return string(b)
	}
	peer := func(i int, field string, v any) string {
		var m map[string]any
		_ = json.Unmarshal([]byte(goodJSON), &m)
		m["peers"].([]any)[i].(map[string]any)[field] = v
		b, _ := json.Marshal(m)
		return string(b)
	}
	// inlineKey gives peers[0] (or, with field "identities", the first
	// identity; with "secret_key", the node itself) an inline key in
	// place of its key file.
	inlineKey := func(where, key string) string {
		var m map[string]any
		_ = json.Unmarshal([]byte(goodJSON), &m)
		switch where {
		case "peers", "identities":
			e := m[where].([]any)[0].(map[string]any)
			delete(e, "public_key_file")
			e["public_key"] = key
		default:
			delete(m, "key_file")
			m["secret_key"] = key
		}
		b, _ := json.Marshal(m)
		return string(b)
	}
	z85 := "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7" // a key as kvxfer keygen writes
	cases := []struct {
		name, json string
		want       []string
	}{
		{"unknown field", set(`{"bnid": "tcp://x:1"}`), []string{`unknown field "bnid"`}},
		{"wrong type", set(`{"workers": "four"}`), []string{"workers", "string"}},
		{"duration as a number", set(`{"transfer_timeout": 30}`), []string{"transfer_timeout", "30", "duration"}},
		{"bad duration", set(`{"heartbeat_interval": "1 sec"}`), []string{"heartbeat_interval", `"1 sec"`}},
		{"negative duration", set(`{"drain_grace": "-1s"}`), []string{"drain_grace = -1s"}},
		{"bind without transport", set(`{"bind": "127.0.0.1:5000"}`), []string{`bind = "127.0.0.1:5000"`, "did you mean tcp://127.0.0.1:5000?"}},
		{"no bind", set(`{"bind": null}`), []string{`bind = ""`}},
		{"unknown backend", set(`{"backend": "carrier-pigeon"}`), []string{`backend = "carrier-pigeon"`}},
		{"negative device", set(`{"backend": "cudaipc", "device": -1}`), []string{"device = -1", "CUDA ordinal"}},
		{"device without cudaipc", set(`{"device": 2}`), []string{"device = 2", `backend = "shm"`, `"cudaipc"`}},
		{"memory on cudaipc", set(`{"backend": "cudaipc", "memory": {"kind": "nhd", "num_blocks": 8}}`), []string{"memory = ", "cudaipc", "CallerMemory"}},
		{"revocation on cudaipc", set(`{"backend": "cudaipc", "revoke_spare_bytes": 65536}`), []string{"revoke_spare_bytes = 65536", "cudaipc"}},
		{"unknown model", set(`{"model": "Llama-9"}`), []string{`model = "Llama-9"`}},
		{"no model", set(`{"model": null}`), []string{`model = ""`, "Llama-3.1-8B"}},
		{"rank outside parallel", set(`{"rank": {"tp": 2, "pp": 0}}`), []string{"rank = {TP:2 PP:0}", "outside"}},
		{"zero tp", set(`{"parallel": {"tp": 0, "pp": 2}}`), []string{"parallel = {TP:0 PP:2}"}},
		{"negative workers", set(`{"workers": -1}`), []string{"workers = -1"}},
		{"writer lease under two heartbeats", set(`{"writer_lease": "900ms"}`),
			[]string{"writer_lease = 900ms", "two heartbeat intervals (heartbeat_interval 500ms)", "at least 1s"}},
		{"writer lease under two default heartbeats", set(`{"heartbeat_interval": null, "writer_lease": "1500ms"}`),
			[]string{"writer_lease = 1.5s", "heartbeat_interval 1s", "at least 2s"}},
		{"negative trace_keep", set(`{"trace_path": "t.jsonl", "trace_keep": -1}`), []string{"trace_keep = -1"}},
		{"negative trace_max_bytes", set(`{"trace_path": "t.jsonl", "trace_max_bytes": -5}`), []string{"trace_max_bytes = -5"}},
		{"trace_keep without trace_path", set(`{"trace_path": null, "trace_keep": 2}`), []string{`trace_path = ""`, "trace_keep"}},
		{"negative misses", set(`{"heartbeat_misses": -2}`), []string{"heartbeat_misses = -2"}},
		{"heartbeat of a microsecond", set(`{"heartbeat_interval": "1us"}`), []string{"heartbeat_interval = 1µs", "minimum 10ms"}},
		{"heartbeat just under the minimum", set(`{"heartbeat_interval": "9ms"}`), []string{"heartbeat_interval = 9ms", "minimum 10ms"}},
		{"one miss", set(`{"heartbeat_misses": 1}`), []string{"heartbeat_misses = 1", "must be ≥ 2"}},
		{"liveness timeout overflows", set(`{"heartbeat_interval": "1000000h", "heartbeat_misses": 3000}`), []string{"heartbeat_misses = 3000", "1000000h0m0s", "overflows"}},
		{"metrics address", set(`{"metrics_addr": "9465"}`), []string{`metrics_addr = "9465"`}},
		{"no key", set(`{"key_file": null}`), []string{"key_file", "insecure"}},
		{"two keys", set(`{"secret_key": "x"}`), []string{"key_file", "exactly one"}},
		{"peer rank outside its parallel", peer(1, "rank", map[string]int{"tp": 2}), []string{"peers[1].rank = {TP:2 PP:0}", "outside ctx's parallel"}},
		{"peer twice", peer(1, "rank", map[string]int{"tp": 0}), []string{"peers[1].rank", "ctx/0 is also peers[0]"}},
		{"one instance, two parallelisms", peer(1, "parallel", map[string]int{"tp": 4, "pp": 1}), []string{"peers[1].parallel = {TP:4 PP:1}", "{TP:2 PP:1}"}},
		{"peer endpoint", peer(0, "endpoint", "/run/ctx.sock"), []string{`peers[0].endpoint = "/run/ctx.sock"`, "ipc:///run/ctx.sock"}},
		{"peer endpoint, wildcard host", peer(0, "endpoint", "tcp://*:5600"), []string{`peers[0].endpoint = "tcp://*:5600"`, "wildcard"}},
		{"peer endpoint, port 0", peer(0, "endpoint", "tcp://127.0.0.1:0"), []string{`peers[0].endpoint = "tcp://127.0.0.1:0"`, "port 0 is no peer's port"}},
		{"peer endpoint, ipc path too long", peer(0, "endpoint", "ipc:///"+strings.Repeat("a", 120)), []string{"peers[0].endpoint", "at most 107"}},
		{"peer without instance", peer(0, "instance", ""), []string{`peers[0].instance = ""`}},
		{"peer instance with a slash", peer(0, "instance", "ctx/1"), []string{`peers[0].instance = "ctx/1"`, "contains '/'"}},
		{"instance with a space", set(`{"instance": "bad name"}`), []string{`instance = "bad name"`, "no spaces"}},
		{"peer without key", peer(0, "public_key_file", ""), []string{"peers[0].public_key_file", "exactly one"}},
		{"peer endpoint, separator mistyped", peer(0, "endpoint", "tcp//10.0.0.1:5600"), []string{`peers[0].endpoint = "tcp//10.0.0.1:5600"`, "did you mean tcp://10.0.0.1:5600?"}},
		{"peer key too short", inlineKey("peers", "abc"), []string{`peers[0].public_key = "abc"`, "CURVE key of 3 characters, want 40"}},
		{"peer key not Z85", inlineKey("peers", z85[:39]+`"`), []string{"peers[0].public_key", `character '"' at 39 is not Z85`}},
		{"identity key too short", inlineKey("identities", "abc"), []string{`identities[0].public_key = "abc"`, "want 40"}},
		{"secret key mistyped", inlineKey("secret_key", z85[:30]), []string{"secret_key", "30 characters", "want 40"}},
		{"peer is self", set(`{"instance": "ctx", "rank": {"tp": 0, "pp": 0}}`), []string{"peers[0]", "ctx/0", "this node itself"}},
		{"pool too small", set(`{"pool_bytes": 4096}`), []string{"pool_bytes = 4096", "holds no block"}},
		// Refused before Open allocates it (seconds for a pool this
		// large), naming the JSON key: before, Open mapped it, then the
		// engine refused "PoolBytes = …", with no ErrConfig.
		{"pool of more blocks than a Hello names", set(`{"pool_bytes": 1000000000000000}`), []string{"pool_bytes = 1000000000000000", "more than the 1048576 a pool may hold"}},
		{"workers past the bound", set(`{"workers": 1025}`), []string{"workers = 1025", "must be 1 to 1024"}},
		{"tp does not divide the heads", set(`{"parallel": {"tp": 3, "pp": 1}, "rank": {"tp": 0, "pp": 0}}`), []string{"parallel = {TP:3 PP:1}"}},
		{"stages of another count", set(`{"parallel": {"tp": 1, "pp": 2, "stages": "7,8,8"}, "rank": {"tp": 0, "pp": 0}}`),
			[]string{"parallel = {TP:1 PP:2 Stages:7,8,8}", `Stages "7,8,8": 3 stages of 23 layers in all, want PP 2 stages of the 32 layers`}},
		{"trailing data", goodJSON + "{}", []string{"trailing data"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := node.ParseConfig([]byte(c.json))
			if !errors.Is(err, node.ErrConfig) {
				t.Fatalf("ParseConfig = %v, want ErrConfig", err)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
	// A writer lease of two heartbeat intervals is accepted.
	if _, err := node.ParseConfig([]byte(set(`{"writer_lease": "1s"}`))); err != nil {
		t.Errorf("writer_lease 1s, heartbeat_interval 500ms: %v", err)
	}
	// The least heartbeat settings accepted are accepted.
	least := set(`{"heartbeat_interval": "10ms", "heartbeat_misses": 2}`)
	if _, err := node.ParseConfig([]byte(least)); err != nil {
		t.Errorf("heartbeat_interval %v, heartbeat_misses %d: %v", node.MinHeartbeatInterval, node.MinHeartbeatMisses, err)
	}
	// Well-formed inline keys pass; a mistyped secret key is not echoed.
	for _, where := range []string{"peers", "identities", "secret_key"} {
		if _, err := node.ParseConfig([]byte(inlineKey(where, z85))); err != nil {
			t.Errorf("inline %s key %s: %v", where, z85, err)
		}
	}
	if _, err := node.ParseConfig([]byte(inlineKey("secret_key", z85[:30]))); err == nil || strings.Contains(err.Error(), z85[:30]) {
		t.Errorf("mistyped secret key: error %v shows the key", err)
	}
}

// TestPeersSpellingTheDefaultSplitAreOneParallelism: listed ranks of one
// instance whose parallelism differs only in how the split is spelled
// ("" and the default split spelled out: "16,16" for the 32 layers of
// Llama-3.1-8B at PP2) are one parallelism, and a peer so spelled at this
// node's own place is this node; a real mismatch of the split is still
// refused, naming both. Before, the check compared Stages as spelled and
// refused the first as two parallelisms (and took the second for another
// rank than this node).
func TestPeersSpellingTheDefaultSplitAreOneParallelism(t *testing.T) {
	withPeers := func(self string, stages ...string) string {
		t.Helper()
		var m map[string]any
		if err := json.Unmarshal([]byte(goodJSON), &m); err != nil {
			t.Fatal(err)
		}
		if self != "" {
			m["instance"] = self
			m["parallel"] = map[string]any{"tp": 1, "pp": 2}
			m["rank"] = map[string]any{"tp": 0, "pp": 0}
		}
		var peers []any
		for i, st := range stages {
			peers = append(peers, map[string]any{"instance": "ctx", "parallel": map[string]any{"tp": 1, "pp": 2, "stages": st},
				"rank": map[string]any{"tp": 0, "pp": i}, "endpoint": fmt.Sprintf("tcp://10.0.0.1:56%d0", i),
				"public_key_file": fmt.Sprintf("ctx%d.pub", i)})
		}
		m["peers"] = peers
		b, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	for _, stages := range [][]string{{"", "16,16"}, {"16,16", ""}, {"16,16", "16,16"}} {
		if _, err := node.ParseConfig([]byte(withPeers("", stages...))); err != nil {
			t.Errorf("ctx's ranks with stages %q: %v", stages, err)
		}
	}
	for _, c := range []struct {
		stages []string
		want   []string
	}{
		{[]string{"16,16", "15,17"}, []string{"peers[1].parallel = {TP:1 PP:2 Stages:15,17}", "{TP:1 PP:2 Stages:16,16}", "one instance has one parallelism"}},
		{[]string{"", "15,17"}, []string{"peers[1].parallel = {TP:1 PP:2 Stages:15,17}", "says {TP:1 PP:2}:"}},
		{[]string{"17,15", "16,16"}, []string{"peers[1].parallel = {TP:1 PP:2 Stages:16,16}", "{TP:1 PP:2 Stages:17,15}"}},
	} {
		_, err := node.ParseConfig([]byte(withPeers("", c.stages...)))
		if !errors.Is(err, node.ErrConfig) {
			t.Errorf("ctx's ranks with stages %q: ParseConfig = %v, want ErrConfig", c.stages, err)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("ctx's ranks with stages %q: error %q lacks %q", c.stages, err, w)
			}
		}
	}
	// A split the model cannot take is named at the config (it was taken,
	// to fail at the peer's Hello or a request's plan).
	for _, st := range []string{"7,8", "16,16,0", "x"} {
		_, err := node.ParseConfig([]byte(withPeers("", st, st)))
		if !errors.Is(err, node.ErrConfig) || !strings.Contains(err.Error(), "peers[0].parallel") {
			t.Errorf("ctx's ranks with stages %q: ParseConfig = %v, want ErrConfig naming peers[0].parallel", st, err)
		}
	}
	// This node is ctx's rank pp0 of TP1/PP2 (no stages): a peer listed
	// there with the default split spelled out is this node.
	_, err := node.ParseConfig([]byte(withPeers("ctx", "16,16", "")))
	if !errors.Is(err, node.ErrConfig) || !strings.Contains(err.Error(), "peers[0]") || !strings.Contains(err.Error(), "this node itself") {
		t.Errorf("this node's own place listed with the default split spelled out: ParseConfig = %v, want it named as this node", err)
	}
}

// TestUCXBackendWithoutUCXNamed: asking for ucx in a build without it
// names the backend and the way out.
func TestUCXBackendWithoutUCXNamed(t *testing.T) {
	if ucx.Available {
		t.Skip("this build has the ucx backend")
	}
	_, err := node.ParseConfig([]byte(strings.Replace(goodJSON, `"backend": "shm"`, `"backend": "ucx"`, 1)))
	if !errors.Is(err, node.ErrConfig) || !strings.Contains(err.Error(), `backend = "ucx"`) || !strings.Contains(err.Error(), `"shm"`) {
		t.Fatalf("ParseConfig(backend ucx) = %v", err)
	}
}

// TestWriterLeaseUnderTwoHeartbeatsRefused: a writer_lease shorter than
// two heartbeat intervals is refused at Open, naming both, as kvxfer ctx
// refuses --writer-lease. The link renews the lease at most once per
// interval: such a lease lapses between a live peer's heartbeats. Before,
// Open took it (from Go, the C ABI's JSON or Python's writer_lease), and
// every request with a live generation peer whose prefill took longer
// than the lease failed "gen/0 let its writer lease lapse".
func TestWriterLeaseUnderTwoHeartbeatsRefused(t *testing.T) {
	cc, _ := pair(t, shm.Backend)
	cc.SendOnly = true
	cc.WriterLease = node.Duration(beat / 5)
	n, err := node.Open(context.Background(), cc)
	if err == nil {
		_ = n.Close(context.Background())
	}
	want := fmt.Sprintf("writer_lease = %v: shorter than two heartbeat intervals (heartbeat_interval %v)", beat/5, beat)
	if !errors.Is(err, node.ErrConfig) || !strings.Contains(err.Error(), want) {
		t.Fatalf("Open with writer_lease %v, heartbeat_interval %v: %v, want ErrConfig with %q", beat/5, beat, err, want)
	}
}
