package cudaipc

import (
	"fmt"
	"strings"

	"github.com/kvxfer/kvxfer/rdma"
	"github.com/kvxfer/kvxfer/rdma/internal/agentaddr"
)

// addrScheme starts every agent address. Version 1 ("cudaipc:") had no
// agent file (see agentFile): a writer of version 1 refuses these
// addresses by their scheme, and this one refuses version 1's by name.
const addrScheme = "cudaipc2"

// addrSchemeV1 is the scheme of version 1's addresses.
const addrSchemeV1 = "cudaipc"

// address is a parsed agent address ("cudaipc2:<pid>:<nonce>", see
// rdma/internal/agentaddr).
type address struct {
	pid   int
	nonce [16]byte
}

func (a address) String() string { return agentaddr.Format(addrScheme, uint64(a.pid), a.nonce) }

// parseAddress parses an address of this backend; errors wrap
// rdma.ErrBadAddress and quote the input.
func parseAddress(b []byte) (address, error) {
	if strings.HasPrefix(string(b), addrSchemeV1+":") {
		return address{}, fmt.Errorf("%w: %q is an agent address of cudaipc version 1 (no agent file stating whom it serves): this writer connects to %q agents only: run the same kvxfer version on both sides",
			rdma.ErrBadAddress, b, addrScheme)
	}
	n, nonce, err := agentaddr.Parse(addrScheme, "pid", 1<<31-1, b)
	if err != nil {
		return address{}, err
	}
	return address{pid: int(n), nonce: nonce}, nil
}
