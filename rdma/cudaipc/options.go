package cudaipc

import "github.com/kvxfer/kvxfer/cuda"

// Option configures an Agent.
type Option func(*options)

type options struct {
	device int
	poller *cuda.Poller
}

// WithDevice makes the agent copy with GPU ordinal (default 0): its
// endpoints' streams, and the mappings of peers' memory, live there.
func WithDevice(ordinal int) Option { return func(o *options) { o.device = ordinal } }

// WithPoller makes the agent's completions come from p (default
// cuda.DefaultPoller()).
func WithPoller(p *cuda.Poller) Option { return func(o *options) { o.poller = p } }
