//go:build cgo && linux && !kvxfer_noucx

package ucx

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/kvxfer/kvxfer/rdma"
)

// TestAliasOf: a peer's worker address carrying this worker's uuid or its
// self transport's interface is refused; a real other worker's is not.
func TestAliasOf(t *testing.T) {
	own, err := validateWorkerAddress(realAddresses(t)["default"])
	if err != nil {
		t.Fatal(err)
	}
	parse := func(b []byte) workerAddress {
		wa, err := validateWorkerAddress(b)
		if err != nil {
			t.Fatal(err)
		}
		return wa
	}
	peer := bytes.Clone(realAddresses(t)["default"])
	if why := aliasOf(own, parse(peer)); !strings.Contains(why, "uuid") {
		t.Fatalf("this worker's own address: %q, want its uuid named", why)
	}
	peer[1] ^= 1 // another uuid (v1: the uuid follows the header byte)
	wa := parse(peer)
	if why := aliasOf(own, wa); !strings.Contains(why, "self transport") {
		t.Fatalf("another uuid, this worker's self interface: %q, want the self transport named", why)
	}
	for _, d := range wa.devices { // another self interface id (aliases peer)
		for _, f := range d.ifaces {
			if f.tl == crc16("self") {
				f.addr[0] ^= 1
			}
		}
	}
	if why := aliasOf(own, parse(peer)); why != "" {
		t.Fatalf("another uuid and self interface (cma of this process: a worker of this process may be a peer): %q", why)
	}
	if why := aliasOf(own, parse(realAddresses(t)["debug info"])); why != "" {
		t.Fatalf("another worker's address: %q", why)
	}
}

// TestConnectRefusesAnAddressNamingThisWorker: an agent address with
// another agent's key around this agent's own worker address is refused
// at Connect, naming why; the agent's own address still connects.
func TestConnectRefusesAnAddressNamingThisWorker(t *testing.T) {
	t.Setenv("UCX_TLS", "tcp")
	a, err := New()
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	other, err := New()
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	own, err := parseAddress(a.Address())
	if err != nil {
		t.Fatal(err)
	}
	forged := newAddress(other.pub, other.spub, own.worker).encode()
	ep, err := a.Connect(forged)
	if err == nil {
		ep.Close()
		t.Fatal("Connect to this worker under another agent's key succeeded")
	}
	if !errors.Is(err, rdma.ErrBadAddress) || !strings.Contains(err.Error(), "this worker") {
		t.Fatalf("Connect: %v, want ErrBadAddress naming this worker", err)
	}
	ep, err = a.Connect(a.Address())
	if err != nil {
		t.Fatalf("Connect to itself: %v", err)
	}
	ep.Close()
}
