package discovery_test

import (
	"context"
	"fmt"

	"github.com/kvxfer/kvxfer/discovery"
	"github.com/kvxfer/kvxfer/messages"
)

// A rank opens the registry its --discovery flag names, registers its own
// record and follows its peers. With "static" the peers are the configured
// list; with etcd://host:port they are whoever registers under --cluster.
func ExampleOpen() {
	ctx := context.Background()
	peers := []discovery.Record{{Instance: "ctx", Rank: 0, ControlEndpoint: "tcp://10.0.0.1:5000"}}
	reg, err := discovery.Open(ctx, "static", "demo", peers)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer reg.Close()
	self := discovery.Record{Instance: "gen", Rank: 0, Incarnation: discovery.NewIncarnation(),
		ControlEndpoint: "tcp://10.0.0.2:5000", Backend: "shm", AgentAddr: []byte("shm:1:2"),
		Parallel: messages.Parallel{TP: 1, PP: 1}}
	if err := reg.Register(ctx, self); err != nil {
		fmt.Println(err)
		return
	}
	ev := <-reg.Events()
	fmt.Println(ev.Kind, ev.Record.Peer(), ev.Record.ControlEndpoint)
	// Output: UP ctx/0 tcp://10.0.0.1:5000
}
