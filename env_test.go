package kvxfer_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/kvxfer/kvxfer"
)

// TestWithEnvRefusesBadWorkerCount: KVXFER_WORKERS outside 1..MaxWorkers
// is refused by WithEnv, naming the variable and its value, as a
// non-integer one is, rather than taken and refused at Start as
// "Workers = 0", which does not say where the 0 came from. (Checked to
// fail: without the check WithEnv returned no error for 0, -3 and 1025.)
func TestWithEnvRefusesBadWorkerCount(t *testing.T) {
	for _, v := range []string{"0", "-3", "1025"} {
		t.Setenv("KVXFER_WORKERS", v)
		_, err := kvxfer.Config{}.WithEnv()
		if !errors.Is(err, kvxfer.ErrConfig) || !strings.Contains(err.Error(), `KVXFER_WORKERS = "`+v+`"`) {
			t.Fatalf("KVXFER_WORKERS=%s: %v, want ErrConfig naming the variable and its value", v, err)
		}
	}
	t.Setenv("KVXFER_WORKERS", "3")
	if c, err := (kvxfer.Config{}).WithEnv(); err != nil || c.Workers != 3 {
		t.Fatalf("KVXFER_WORKERS=3: %d workers, %v", c.Workers, err)
	}
}
