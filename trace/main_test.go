package trace_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/kvxfer/kvxfer/internal/proc"
)

// Environment of a child process of TestTwoProcessReplay.
const (
	roleEnv = "KVXFER_TRACE_TEST_ROLE"
	optsEnv = "KVXFER_TRACE_TEST_OPTS"
)

func TestMain(m *testing.M) {
	if role := os.Getenv(roleEnv); role != "" {
		os.Exit(runRole(role))
	}
	goleak.VerifyTestMain(m)
}

// runRole is a child process: one role of a two-process run, tracing to
// Options.TracePath.
func runRole(role string) int {
	if role == holdRole {
		return holdTrace(os.Getenv(optsEnv))
	}
	var o proc.Options
	if err := json.Unmarshal([]byte(os.Getenv(optsEnv)), &o); err != nil {
		fmt.Fprintln(os.Stderr, "bad options:", err)
		return 2
	}
	var rep proc.Report
	var err error
	switch role {
	case "gen":
		rep, err = proc.RunGen(context.Background(), o, os.Stdout)
	case "ctx":
		rep, err = proc.RunCtx(context.Background(), o, os.Stdout)
	default:
		err = fmt.Errorf("unknown role %q", role)
	}
	if err == nil && (rep.Failed > 0 || rep.LeakedBlocks > 0) {
		err = fmt.Errorf("%d failed, %d leaked blocks: %s", rep.Failed, rep.LeakedBlocks, rep.FirstError)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, role+":", err)
		return 1
	}
	return 0
}
