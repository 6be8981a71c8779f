package capi

import (
	"fmt"
	"math"
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
