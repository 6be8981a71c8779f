package ucx

import "testing"

func TestConfigMods(t *testing.T) {
	env := map[string]string{}
	getenv := func(k string) string { return env[k] }
	if got, want := configMods(defaultOptions(), getenv), "KEEPALIVE_INTERVAL=1000000us\nMM_ERROR_HANDLING=y"; got != want {
		t.Errorf("configMods = %q, want %q", got, want)
	}
	env["UCX_KEEPALIVE_INTERVAL"] = "5s"
	env["UCX_POSIX_ERROR_HANDLING"] = "n"
	if got := configMods(defaultOptions(), getenv); got != "" {
		t.Errorf("configMods with UCX_* set = %q, want nothing", got)
	}
}
