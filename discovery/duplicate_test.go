package discovery

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestEtcdDuplicateBelowTheHolderIsNamed: a second process started as a
// rank that runs, whose incarnation is below the live one's (its host's
// clock behind the other host's, or two processes started together, the
// later-stamped one registering first), is refused at once. The refusal
// must say what it is — the rank is held by a live incarnation, at its
// endpoint: another process runs as the rank — and match ErrHeld, as a
// wait for such a holder does. It said only that the incarnation key
// names a higher incarnation, asking whether the clock stepped back or
// the key was written by hand. Both paths are tried: a registry that saw
// the holder's registration (its table refuses), and one whose watch has
// not delivered it yet (etcd's incarnation key refuses).
func TestEtcdDuplicateBelowTheHolderIsNamed(t *testing.T) {
	cluster := clusterName(t)
	holder := newEtcdRegistry(t, cluster)
	live := testRecord("ctx", 0, 7)
	live.ControlEndpoint = "tcp://10.1.2.3:5555"
	if err := holder.Register(ctxFor(t, 10*time.Second), live); err != nil {
		t.Fatal(err)
	}
	check := func(path string, err error) {
		t.Helper()
		if !errors.Is(err, ErrStaleIncarnation) || !errors.Is(err, ErrHeld) {
			t.Errorf("%s: %v, want ErrStaleIncarnation and ErrHeld", path, err)
			return
		}
		for _, want := range []string{"incarnation 7", live.ControlEndpoint, "Another process runs as ctx/0"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s: %q does not say %q", path, err, want)
			}
		}
	}
	saw := newEtcdRegistry(t, cluster)
	waitEvent(t, saw, waitFor, "ctx/0#7 up", isUp("ctx", 0, 7))
	check("a registry that saw the holder", saw.Register(ctxFor(t, 10*time.Second), testRecord("ctx", 0, 3)))

	blind := newEtcdRegistry(t, cluster)
	blind.mu.Lock()
	blind.m = newMembers(cluster) // its watch has not delivered the holder yet
	blind.mu.Unlock()
	check("a registry that did not see the holder", blind.Register(ctxFor(t, 10*time.Second), testRecord("ctx", 0, 3)))
}

// readThenKV runs then once, right after the first read of key: what
// another process does between a Register's read of its incarnation key
// and its write.
type readThenKV struct {
	clientv3.KV
	key  string
	once sync.Once
	then func()
}

func (k *readThenKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	resp, err := k.KV.Get(ctx, key, opts...)
	if key == k.key {
		k.once.Do(k.then)
	}
	return resp, err
}

// TestEtcdDuplicateStartedTogetherIsNamed: two processes started as one
// rank at the same time, the later-stamped one registering first — it
// commits between the other's read of the rank's incarnation key (still
// empty) and its write. The other is refused at once, and the refusal
// must say, as on the other paths, that a live incarnation holds the rank
// at its endpoint, another process, and match ErrHeld: it said only that
// the key holds a higher incarnation under a live lease, matching
// ErrStaleIncarnation alone (the CLI gave no hint of the duplicate).
func TestEtcdDuplicateStartedTogetherIsNamed(t *testing.T) {
	cluster := clusterName(t)
	holder := newEtcdRegistry(t, cluster)
	live := testRecord("ctx", 0, 7)
	live.ControlEndpoint = "tcp://10.1.2.3:5555"
	cli := newClient(t)
	defer cli.Close()
	kv := &readThenKV{KV: cli.KV, key: IncarnationKey(cluster, "ctx", 0), then: func() {
		if err := holder.Register(ctxFor(t, 10*time.Second), live); err != nil {
			t.Errorf("the holder's Register: %v", err)
		}
	}}
	cli.KV = kv
	r := newEtcdRegistry(t, cluster, WithClient(cli))
	err := r.Register(ctxFor(t, 10*time.Second), testRecord("ctx", 0, 3))
	if !errors.Is(err, ErrStaleIncarnation) || !errors.Is(err, ErrHeld) {
		t.Fatalf("Register below a holder that committed meanwhile: %v, want ErrStaleIncarnation and ErrHeld", err)
	}
	for _, want := range []string{"incarnation 7", live.ControlEndpoint, "Another process runs as ctx/0"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not say %q", err, want)
		}
	}
}
