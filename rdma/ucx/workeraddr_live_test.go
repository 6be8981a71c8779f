//go:build cgo && linux && !kvxfer_noucx

package ucx

import (
	"os"
	"testing"
)

// TestWorkerAddressOfLiveWorkers: the addresses of this host's UCX workers
// validate, in every transport mode and address format the tests use.
func TestWorkerAddressOfLiveWorkers(t *testing.T) {
	for _, c := range []struct{ name, tls, version, debug string }{
		{"default", "", "", ""},
		{"default v2", "", "v2", ""},
		{"default debug info", "", "", "y"},
		{"tcp", "tcp", "", ""},
		{"tcp v2", "tcp", "v2", "y"},
	} {
		t.Run(c.name, func(t *testing.T) {
			for k, v := range map[string]string{"UCX_TLS": c.tls, "UCX_ADDRESS_VERSION": c.version, "UCX_ADDRESS_DEBUG_INFO": c.debug} {
				t.Setenv(k, v) // restores the old value afterwards
				if v == "" {
					os.Unsetenv(k)
				}
			}
			a, err := New()
			if err != nil {
				t.Skipf("no UCX agent here: %v", err)
			}
			defer a.Close()
			pa, err := parseAddress(a.Address()) // validates
			if err != nil {
				t.Fatal(err)
			}
			wa, err := validateWorkerAddress(pa.worker)
			if err != nil {
				t.Fatal(err)
			}
			if len(wa.devices) == 0 {
				t.Fatalf("no devices in %x", pa.worker)
			}
		})
	}
}
