package main

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/internal/config"
	"github.com/kvxfer/kvxfer/internal/demo"
)

// TestClusterDefaultsKeepSettingsNamedByEnvOrFile: demo --cluster's small
// defaults (2 workers, 192MiB pools, 1m) replace only the settings nobody
// chose: workers, pool and timeout given by a variable or by the --config
// file reach the three processes as given, like a flag's. The demo's own
// timeout is the one its processes get. Before, clusterDefaults asked
// only whether the flag was given, so KVXFER_WORKERS=3 KVXFER_POOL=320MiB
// ran processes with --workers 2 --pool 192MiB (while the settings log
// showed 3 and 320MiB), and the demo kept its 5m timeout while its
// processes got 1m.
func TestClusterDefaultsKeepSettingsNamedByEnvOrFile(t *testing.T) {
	for _, c := range []struct {
		name string
		env  map[string]string
		file string
		args []string
		// want is each setting's value on the processes' command line;
		// wantTimeout the timeout, theirs (--timeout) and the demo's own.
		want        map[string]string
		wantTimeout time.Duration
	}{
		{name: "nothing chosen",
			want: map[string]string{"--workers": "2", "--pool": "192MiB"}, wantTimeout: time.Minute},
		{name: "variables", env: map[string]string{"KVXFER_WORKERS": "3", "KVXFER_POOL": "320MiB"},
			want: map[string]string{"--workers": "3", "--pool": "320MiB"}, wantTimeout: time.Minute},
		{name: "variable timeout", env: map[string]string{"KVXFER_TIMEOUT": "90s"},
			want: map[string]string{"--workers": "2", "--pool": "192MiB"}, wantTimeout: 90 * time.Second},
		{name: "config file", file: "workers: 3\npool: 320MiB\ntimeout: 2m\n",
			want: map[string]string{"--workers": "3", "--pool": "320MiB"}, wantTimeout: 2 * time.Minute},
		{name: "flags", args: []string{"--workers", "5", "--pool", "256MiB", "--timeout", "3m"},
			want: map[string]string{"--workers": "5", "--pool": "256MiB"}, wantTimeout: 3 * time.Minute},
	} {
		t.Run(c.name, func(t *testing.T) {
			a := newApp()
			cmd := newDemoCmd(a)
			if err := cmd.ParseFlags(append([]string{"--cluster"}, c.args...)); err != nil {
				t.Fatal(err)
			}
			l := config.Loader{Env: func(k string) (string, bool) { v, ok := c.env[k]; return v, ok },
				Flags: cmd.Flags(), Defaults: demoDefaults}
			if c.file != "" {
				l.File = filepath.Join(t.TempDir(), "kvxfer.yaml")
				if err := os.WriteFile(l.File, []byte(c.file), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			s, err := l.Load(demoKeys...)
			if err != nil {
				t.Fatal(err)
			}
			// As demo's RunE resolves the settings before --cluster's
			// defaults.
			f := demoFlags{o: demo.DefaultOptions(), cluster: true}
			f.o.PoolBytes, f.o.Workers, f.o.Timeout = s.Pool, s.Workers, s.Timeout
			f.pool, f.timeout = s.Origin(config.Pool).Raw, s.Timeout.String()
			if err := clusterDefaults(cmd, &s, &f); err != nil {
				t.Fatal(err)
			}
			args := roleArgs(a, f)
			for flag, v := range c.want {
				i := slices.Index(args, flag)
				if i < 0 || i+1 >= len(args) || args[i+1] != v {
					t.Errorf("the processes get %v, want %s %s", args, flag, v)
				}
			}
			i := slices.Index(args, "--timeout")
			if i < 0 || i+1 >= len(args) {
				t.Fatalf("the processes get no --timeout: %v", args)
			}
			if theirs, err := time.ParseDuration(args[i+1]); err != nil || theirs != c.wantTimeout || f.o.Timeout != c.wantTimeout {
				t.Errorf("the demo's own timeout is %v, its processes' --timeout %s, want both %v", f.o.Timeout, args[i+1], c.wantTimeout)
			}
		})
	}
}
