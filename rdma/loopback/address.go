package loopback

import (
	"github.com/kvxfer/kvxfer/rdma/internal/agentaddr"
)

const addrScheme = "loopback"

// address is a parsed agent address ("loopback:<agent-id>:<nonce>", see
// rdma/internal/agentaddr).
type address struct {
	id    uint64
	nonce [16]byte
}

func (a address) String() string { return agentaddr.Format(addrScheme, a.id, a.nonce) }

// parseAddress parses an address of this backend; errors wrap
// rdma.ErrBadAddress and quote the input.
func parseAddress(b []byte) (address, error) {
	n, nonce, err := agentaddr.Parse(addrScheme, "agent id", 1<<64-1, b)
	if err != nil {
		return address{}, err
	}
	return address{id: n, nonce: nonce}, nil
}
