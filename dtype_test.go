package kvxfer_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/control"
)

// TestDTypeBytesOutsideElementSizesRefused: a layout's DTypeBytes of 3
// (or 16, which the layout's own bound let through) is no element size a
// KV dtype has, yet Start took it and laid blocks out at 3 bytes an
// element. It is now refused at Start, and by Config.LayoutShape, with
// ErrConfig naming the value and the accepted set; 1, 2, 4 and 8 still
// start. Checked to fail without the fix (3 and 16 started).
func TestDTypeBytesOutsideElementSizesRefused(t *testing.T) {
	link := control.NewMemLink()
	for _, db := range []int{3, 5, 6, 16} {
		l := smallLayout()
		l.DTypeBytes = db
		cfg := kvxfer.Config{Instance: "dtype", Layout: &l, PoolBytes: 1 << 20, Workers: 1, Link: link}
		e, err := kvxfer.Start(context.Background(), cfg)
		if e != nil {
			_ = e.Close(context.Background())
		}
		want := []string{"DTypeBytes = " + strconv.Itoa(db), "[1 2 4 8]"}
		if !errors.Is(err, kvxfer.ErrConfig) || !containsAll(err.Error(), want) {
			t.Fatalf("Start with DTypeBytes %d: %v, want ErrConfig naming %q", db, err, want)
		}
		if _, _, err := cfg.LayoutShape(); !errors.Is(err, kvxfer.ErrConfig) || !containsAll(err.Error(), want) {
			t.Fatalf("LayoutShape with DTypeBytes %d: %v, want ErrConfig naming %q", db, err, want)
		}
	}
	for _, db := range []int{1, 2, 4, 8} {
		l := smallLayout()
		l.DTypeBytes = db
		e, err := kvxfer.Start(context.Background(), kvxfer.Config{Instance: "dtype-ok", Layout: &l, PoolBytes: 1 << 20,
			Workers: 1, Link: link})
		if err != nil {
			t.Fatalf("Start with DTypeBytes %d: %v", db, err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err = e.Close(ctx)
		cancel()
		if err != nil {
			t.Fatalf("close (DTypeBytes %d): %v", db, err)
		}
	}
}

func containsAll(s string, subs []string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
