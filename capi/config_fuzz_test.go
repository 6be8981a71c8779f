package capi

import (
	"encoding/json"
	"testing"
)

// FuzzParseConfig: any input either parses or is refused with
// KVXFER_ERR_CONFIG and a message; it never panics, and what parses
// survives a round trip through its own JSON.
func FuzzParseConfig(f *testing.F) {
	for _, s := range []string{
		``, `{}`, `{"model":"Llama-3.1-8B"}`, `{"modle":1}`, `{"tp":"x"}`, `{"model":"a"} {}`,
		`{"instance":"p","layout":{"layers":2,"kv_heads":2,"head_dim":4,"dtype_bytes":2,"tokens_per_block":16,` +
			`"groups":[{"name":"full","layers":[0,1]}]},"pool_bytes":65536,"transfer_timeout_ms":-1}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, js string) {
		c, err := ParseConfig(js)
		if err != nil {
			if Code(err) != ErrConfig || err.Error() == "" {
				t.Fatalf("ParseConfig(%q): %v (code %v)", js, err, Code(err))
			}
			return
		}
		again, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		c2, err := ParseConfig(string(again))
		if err != nil {
			t.Fatalf("re-encoded %s: %v", again, err)
		}
		if b, _ := json.Marshal(c2); string(b) != string(again) {
			t.Fatalf("round trip %s != %s", b, again)
		}
		if _, err := c.engineConfig(); err != nil && Code(err) != ErrConfig {
			t.Fatalf("engineConfig of %q: %v", js, err)
		}
	})
}
