package cudaipc

import "github.com/kvxfer/kvxfer/cuda"

// Option configures an Agent.
type Option func(*options)

type options struct {
	device   int
	poller   *cuda.Poller
	identity string
}

// WithDevice makes the agent copy with GPU ordinal (default 0): its
// endpoints' streams, and the mappings of peers' memory, live there.
func WithDevice(ordinal int) Option { return func(o *options) { o.device = ordinal } }

// WithPoller makes the agent's completions come from p (default
// cuda.DefaultPoller()).
func WithPoller(p *cuda.Poller) Option { return func(o *options) { o.poller = p } }

// WithIdentity names whom this agent serves (a node: its rank,
// "instance/rank"; at most MaxIdentity bytes). The agent states it in its
// agent file, which only its process creates (see the package doc), and
// the endpoints of other agents to it report it
// (rdma.IdentifiedEndpoint), so that a writer can check that an agent
// address a peer named reaches that peer's agent, not another's (another
// instance's, or the writer's own).
func WithIdentity(id string) Option { return func(o *options) { o.identity = id } }
