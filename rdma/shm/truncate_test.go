package shm_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma"
	"github.com/kvxfer/kvxfer/rdma/shm"
)

// truncateChildEnv makes the test binary, re-executed, run the writer side
// of TestPeerTruncatedFileFailsBatchNotProcess.
const truncateChildEnv = "KVXFER_SHM_TRUNCATE_CHILD"

// truncatePrefix starts the child's region file names, then its pid.
const truncatePrefix = "kvxfer-test-truncated-"

// TestPeerTruncatedFileFailsBatchNotProcess: the receiver owns its region
// file and may truncate it after a sender mapped it. The sender's next copy
// then touches pages past the file's end; that must fail the batch with
// rdma.ErrPeerGone, not kill the sender's process with SIGBUS. The writer
// runs in a child process so that a crash is observable. (Checked to fail
// without the fault guard: the child dies with "unexpected fault address".)
func TestPeerTruncatedFileFailsBatchNotProcess(t *testing.T) {
	if os.Getenv(truncateChildEnv) != "" {
		for _, size := range []int64{2 * 4096, 0} { // data gone; header page gone too
			t.Run(fmt.Sprintf("truncate=%d", size), func(t *testing.T) { truncatedPeerFile(t, size) })
		}
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^TestPeerTruncatedFileFailsBatchNotProcess$", "-test.count", "1", "-test.v")
	cmd.Env = append(os.Environ(), truncateChildEnv+"=1")
	out, err := cmd.CombinedOutput()
	if cmd.Process != nil { // a child that died leaves its region files
		left, _ := filepath.Glob(filepath.Join(shm.Dir(), fmt.Sprintf("%s%d-*", truncatePrefix, cmd.Process.Pid)))
		for _, f := range left {
			os.Remove(f)
		}
	}
	if s := string(out); strings.Contains(s, "SIGBUS") || strings.Contains(s, "unexpected fault address") {
		t.Fatalf("the writer process died copying into a region file its owner truncated: %v\n%.3000s", err, out)
	}
	if err != nil || !strings.Contains(string(out), "--- PASS: TestPeerTruncatedFileFailsBatchNotProcess") {
		t.Fatalf("writer child: %v\n%s", err, out)
	}
}

// truncatedPeerFile runs in the child: one batch lands, the receiver's file
// is truncated to size bytes, the next batch into it fails with
// rdma.ErrPeerGone naming the file, and later posts into it are refused the
// same way, while the same endpoint still writes into another region.
func truncatedPeerFile(t *testing.T, size int64) {
	sender, receiver := shm.New(), shm.New()
	defer sender.Close()
	defer receiver.Close()
	src, err := kvcache.NewHostRegion(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	sreg, err := sender.Register(src)
	if err != nil {
		t.Fatal(err)
	}
	newDst := func(name string) rdma.RemoteRegion {
		r, c, err := shm.NewRegion(name, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		reg, err := receiver.Register(r)
		if err != nil {
			c.Close()
			t.Fatal(err)
		}
		t.Cleanup(func() { // after the agents closed: nothing in flight
			if err := c.Close(); err != nil {
				t.Errorf("close region %s: %v", name, err)
			}
			if _, err := os.Stat(filepath.Join(shm.Dir(), name)); !os.IsNotExist(err) {
				t.Errorf("region file %s left behind: %v", name, err)
			}
		})
		return reg.Remote()
	}
	name := fmt.Sprintf("%s%d-%d", truncatePrefix, os.Getpid(), size)
	path := filepath.Join(shm.Dir(), name)
	dst, other := newDst(name), newDst(name+"-other")

	ep, err := sender.Connect(receiver.Address())
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	seg := []kvcache.Segment{{Src: 0, Dst: 512 << 10, Len: 4096}}
	// post returns Post's error (refused), or the batch's (failed).
	post := func(dst rdma.RemoteRegion) (refused, failed error) {
		done := make(chan error, 1)
		if err := ep.Post(rdma.Batch{Src: sreg, Dst: dst, Segments: seg, Done: func(err error) { done <- err }}); err != nil {
			return err, nil
		}
		return nil, <-done
	}

	if refused, failed := post(dst); refused != nil || failed != nil {
		t.Fatalf("batch before the truncation: refused %v, failed %v", refused, failed)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, size); err != nil {
		t.Fatal(err)
	}
	defer func() { // the receiver's own Close touches its header page
		if err := os.Truncate(path, fi.Size()); err != nil {
			t.Error(err)
		}
	}()
	refused, failed := post(dst)
	err = errors.Join(refused, failed)
	switch {
	case err == nil:
		t.Fatalf("a batch into a region file truncated to %d bytes reported success", size)
	case !errors.Is(err, rdma.ErrPeerGone) || !strings.Contains(err.Error(), path):
		t.Fatalf("batch into the truncated file: %v, want rdma.ErrPeerGone naming %s", err, path)
	}
	t.Logf("batch into the truncated file: %v", err)

	refused, failed = post(dst)
	if !errors.Is(refused, rdma.ErrPeerGone) || failed != nil {
		t.Fatalf("post after the fault: refused %v, failed %v; want refused with rdma.ErrPeerGone", refused, failed)
	}
	if refused, failed := post(other); refused != nil || failed != nil {
		t.Fatalf("batch into another region on the same endpoint: refused %v, failed %v", refused, failed)
	}
}
