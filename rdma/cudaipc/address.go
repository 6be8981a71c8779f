package cudaipc

import (
	"github.com/kvxfer/kvxfer/rdma/internal/agentaddr"
)

const addrScheme = "cudaipc"

// address is a parsed agent address ("cudaipc:<pid>:<nonce>", see
// rdma/internal/agentaddr).
type address struct {
	pid   int
	nonce [16]byte
}

func (a address) String() string { return agentaddr.Format(addrScheme, uint64(a.pid), a.nonce) }

// parseAddress parses an address of this backend; errors wrap
// rdma.ErrBadAddress and quote the input.
func parseAddress(b []byte) (address, error) {
	n, nonce, err := agentaddr.Parse(addrScheme, "pid", 1<<31-1, b)
	if err != nil {
		return address{}, err
	}
	return address{pid: int(n), nonce: nonce}, nil
}
