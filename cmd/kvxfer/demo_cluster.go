package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvxfer/kvxfer/control/zmq"
	"github.com/kvxfer/kvxfer/internal/config"
	"github.com/kvxfer/kvxfer/internal/etcdlocal"
)

// clusterDefaults shrinks the demo for --cluster where the user did not
// choose: three engines on a small machine. A demo flag is the user's
// choice when given; a setting (workers, pool, timeout) also when a
// variable or the --config file gave it, so it is decided by the
// setting's origin in s. Decided by the flag alone, a KVXFER_WORKERS or a
// file's pool was replaced in the processes' flags while the settings log
// showed the user's value.
func clusterDefaults(cmd *cobra.Command, s *config.Settings, f *demoFlags) error {
	if cmd.Flags().Changed("processes") {
		return fmt.Errorf("--processes = %d: --cluster runs three processes of its own (context TP2, generation TP1)", f.processes)
	}
	fl := cmd.Flags()
	set := func(name string, apply func()) {
		if !fl.Changed(name) {
			apply()
		}
	}
	setting := func(key string, apply func()) {
		if s.Origin(key).Source == config.SourceDefault {
			apply()
		}
	}
	set("requests", func() { f.o.Requests = 4 })
	set("min-tokens", func() { f.o.MinTokens = 128 })
	set("max-tokens", func() { f.o.MaxTokens = 512 })
	set("chunk-tokens", func() { f.o.ChunkTokens = 128 })
	set("concurrency", func() { f.o.Concurrency = 2 })
	set("compute", func() { f.o.Compute = 0 })
	setting(config.Workers, func() { f.o.Workers = 2 })
	setting(config.Pool, func() { f.o.PoolBytes, f.pool = 192<<20, "192MiB" })
	// The processes' timeout (f.timeout) and the demo's own (f.o.Timeout)
	// are one setting: both change, so that nothing of the demo's reads
	// another timeout than its processes run with.
	setting(config.Timeout, func() { f.o.Timeout, f.timeout = clusterTimeout, clusterTimeout.String() })
	return nil
}

// clusterTimeout is demo --cluster's timeout when none was chosen.
const clusterTimeout = time.Minute

// clusterTTL is the demo's etcd lease TTL.
const clusterTTL = "2s"

// runCluster is `kvxfer demo --cluster`: an embedded etcd in this
// process; `kvxfer gen` (TP1) and two `kvxfer ctx` (TP2, ranks 0 and 1)
// as separate processes, each with its own CURVE keypair, given only the
// etcd URL and the cluster name: endpoints and public keys come from
// etcd. It fails unless all three succeed (every byte verified on the
// generation side, 0 leaked blocks).
func runCluster(ctx context.Context, a *app, cmd *cobra.Command, f demoFlags) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	dir, err := scratchDir(a, "kvxfer-cluster-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	// etcd as production runs it: TLS with client certificates, and
	// etcd's user auth (the ranks' CURVE public keys come from it).
	pki, err := etcdlocal.NewPKI(dir)
	if err != nil {
		return err
	}
	pwFile := filepath.Join(dir, "etcd-password")
	pw := rand.Text()
	if err := os.WriteFile(pwFile, []byte(pw+"\n"), 0o600); err != nil {
		return err
	}
	srv, err := etcdlocal.StartWith(etcdlocal.Options{TLS: &pki, User: "kvxfer", Password: pw})
	if err != nil {
		return err
	}
	defer srv.Close()
	names := []string{"gen", "ctx0", "ctx1"}
	for _, name := range names {
		pub, sec, err := zmq.GenerateKeys()
		if err != nil {
			return err
		}
		if _, _, err := config.WriteKeyPair(filepath.Join(dir, name), pub, sec, false); err != nil {
			return err
		}
	}
	cluster := "demo-" + strconv.Itoa(os.Getpid())
	common := append(roleArgs(a, f), "--discovery", srv.URL(), "--cluster", cluster, "--discovery-ttl", clusterTTL,
		"--discovery-ca", pki.CA, "--discovery-cert", pki.ClientCert, "--discovery-key", pki.ClientKey,
		"--discovery-user", "kvxfer", "--discovery-password-file", pwFile)
	parent := ctx // ended by an interrupt of the demo itself
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Three children copy into the same writers from their own
	// goroutines (when the writers are not files).
	stdout, stderr := &lockedWriter{w: cmd.OutOrStdout()}, &lockedWriter{w: cmd.ErrOrStderr()}
	role := func(name string, args ...string) *exec.Cmd {
		args = append(append(args, "--bind", "ipc://"+filepath.Join(dir, name+".sock"),
			"--key", filepath.Join(dir, name+".key")), common...)
		c := exec.CommandContext(ctx, self, args...)
		c.Stdout, c.Stderr = stdout, stderr
		interruptOnCancel(c)
		return c
	}
	procs := map[string]*exec.Cmd{
		"gen":  role("gen", "gen", "--peer-tp", "2"),
		"ctx0": role("ctx0", append([]string{"ctx", "--tp", "2", "--tp-rank", "0"}, ctxArgs(f)...)...),
		"ctx1": role("ctx1", append([]string{"ctx", "--tp", "2", "--tp-rank", "1"}, ctxArgs(f)...)...),
	}
	a.log.Info().Str("etcd", srv.URL()).Str("cluster", cluster).Str("backend", f.backend).
		Msg("kvxfer demo --cluster: gen (TP1), ctx rank 0 and 1 (TP2), found through etcd (TLS, client certificates, user auth), CURVE")
	var (
		mu     sync.Mutex
		first  string   // the process that failed first (none when the demo was interrupted)
		cause  error    // how it failed
		others []string // the processes that failed after it, or on the demo's interrupt
		wg     sync.WaitGroup
	)
	for _, name := range names {
		c := procs[name]
		if err := startTied(c); err != nil {
			cancel()
			wg.Wait()
			return fmt.Errorf("starting %s: %w", name, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := c.Wait(); err != nil {
				mu.Lock()
				if first == "" && parent.Err() == nil {
					first, cause = name, err
					// The others are interrupted next and each says
					// "interrupted (SIGINT)", as if the user had
					// pressed Ctrl-C: say which process failed first.
					a.log.Error().Str("process", name).Err(err).
						Msgf("kvxfer demo --cluster: %s failed (%v): stopping the other processes (each then reports an interrupt, SIGINT)", name, err)
				} else {
					others = append(others, fmt.Sprintf("%s: %v", name, err))
				}
				mu.Unlock()
				cancel() // one failed: the others would wait for it
			}
		}()
	}
	wg.Wait()
	switch {
	case first != "" && len(others) == 0:
		return fmt.Errorf("cluster demo failed: %s: %v", first, cause)
	case first != "":
		return fmt.Errorf("cluster demo failed: %s failed first (%v); the demo then interrupted the others: %s", first, cause, strings.Join(others, ", "))
	case len(others) > 0: // the demo was interrupted: every process was
		return fmt.Errorf("cluster demo failed: %s", strings.Join(others, ", "))
	}
	fmt.Fprintln(cmd.OutOrStdout(), "OK: cluster of three processes (context TP2, generation TP1) found through etcd, every byte verified on the generation side, 0 leaked blocks")
	return nil
}

// lockedWriter serialises writes to w.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
