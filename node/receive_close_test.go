package node_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/node"
	"github.com/kvxfer/kvxfer/rdma/shm"
)

// TestReceiveBesideClose: Receives whose writer has not said Hello (each
// starts the goroutine that names the writer if it stays silent) run while
// the node closes. Close waits for the node's goroutines; one started by
// a Receive after that wait began was an Add to the WaitGroup concurrent
// with its Wait — a data race, and a goroutine that outlived Close.
// (Checked to fail under -race without goWatch: a race report in 6 of 10
// runs of the test binary.)
func TestReceiveBesideClose(t *testing.T) {
	_, gc := pair(t, shm.Backend) // no ctx node runs: its writer stays silent
	n, err := node.Open(context.Background(), gc)
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{})
	done := make(chan int)
	go func() {
		i := 0
		for ; ; i++ {
			if i == 1 {
				close(started)
			}
			if _, err := n.Receive(context.Background(), kvxfer.ReceiveRequest{ID: fmt.Sprint("r", i), PromptLen: 16, Context: "ctx"}); err != nil {
				break
			}
		}
		done <- i
	}()
	<-started
	_ = n.Close(context.Background()) // it cancels the requests; their writer never answers
	if i := <-done; i < 1 {
		t.Fatalf("%d Receives before Close", i)
	}
}
