package node_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/kvxfer/kvxfer/node"
)

// TestValidateEtcdPeerPinnedKey: a peer that etcd finds (no endpoint) may
// pin its public key inline; a mistyped one is refused by Validate,
// naming the field and the value, as a static peer's is. Before, Validate
// skipped the check for such a peer, and the key failed only once the
// peer registered, as a record refused for a key mismatch.
func TestValidateEtcdPeerPinnedKey(t *testing.T) {
	const z85 = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7" // a key as kvxfer keygen writes
	parse := func(key string) error {
		_, err := node.ParseConfig([]byte(`{"model":"Llama-3.1-8B","bind":"tcp://127.0.0.1:0","key_file":"gen.key",
			"discovery":"etcd://127.0.0.1:2379","cluster":"c1","peers":[{"instance":"ctx","public_key":"` + key + `"}]}`))
		return err
	}
	if err := parse(z85); err != nil {
		t.Fatalf("an etcd peer pinning a well-formed key: %v", err)
	}
	err := parse("not-a-key")
	const want = `peers[0].public_key = "not-a-key": CURVE key of 9 characters, want 40`
	if !errors.Is(err, node.ErrConfig) || !strings.Contains(err.Error(), want) {
		t.Fatalf("an etcd peer pinning a mistyped key: %v, want ErrConfig containing %q", err, want)
	}
}

// TestValidateIdentityInstanceAndRanks: an identity's instance is checked
// as a peer's is (length, and no '/', space or control character: a name
// no sender can have binds the key to no one), and its ranks must be rank
// indexes a sender can have. Each is refused naming the field and the
// value. Before, only an empty instance was refused.
func TestValidateIdentityInstanceAndRanks(t *testing.T) {
	const z85 = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"
	base := func(id node.Identity) node.Config {
		id.PublicKey = z85
		return node.Config{Instance: "gen", Model: "Llama-3.1-8B", Backend: "shm", Bind: "tcp://127.0.0.1:0",
			KeyFile: "gen.key", Identities: []node.Identity{id}}
	}
	if err := base(node.Identity{Instance: "router", Ranks: []int32{0, 65535}}).Validate(); err != nil {
		t.Fatalf("a valid identity: %v", err)
	}
	for _, c := range []struct {
		name string
		id   node.Identity
		want []string
	}{
		{"empty instance", node.Identity{}, []string{`identities[0].instance = "": want 1..128 bytes`}},
		{"instance too long", node.Identity{Instance: strings.Repeat("r", 129)}, []string{`identities[0].instance = "rrrr`, "want 1..128 bytes"}},
		{"instance with a rank", node.Identity{Instance: "ctx/0"}, []string{`identities[0].instance = "ctx/0": contains '/'`}},
		{"instance with a space", node.Identity{Instance: "my router"}, []string{`identities[0].instance = "my router": contains ' '`}},
		{"negative rank", node.Identity{Instance: "router", Ranks: []int32{-5}}, []string{`identities[0].ranks[0] = -5: want a rank index 0..65535`}},
		{"rank past the last", node.Identity{Instance: "router", Ranks: []int32{1, 65536}}, []string{`identities[0].ranks[1] = 65536: want a rank index 0..65535`}},
	} {
		err := base(c.id).Validate()
		if !errors.Is(err, node.ErrConfig) {
			t.Errorf("%s: %v, want ErrConfig", c.name, err)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q lacks %q", c.name, err, w)
			}
		}
	}
}

// TestValidateInsecureWithKeysRefused: insecure turns CURVE off, so keys
// given with it would be ignored without a word, the user believing the
// link authenticated: Validate refuses them, naming each field (a secret
// by its name alone), as the CLI refuses --insecure with --key or
// --peer-key. Insecure alone is valid.
func TestValidateInsecureWithKeysRefused(t *testing.T) {
	const z85 = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"
	base := func() node.Config {
		return node.Config{Instance: "gen", Model: "Llama-3.1-8B", Backend: "shm", Bind: "tcp://127.0.0.1:0", Insecure: true,
			Peers: []node.Peer{{Instance: "ctx", Endpoint: "tcp://127.0.0.1:5555"}}}
	}
	if err := base().Validate(); err != nil {
		t.Fatalf("insecure without keys: %v", err)
	}
	for _, c := range []struct {
		name string
		set  func(*node.Config)
		want []string
	}{
		{"key_file", func(c *node.Config) { c.KeyFile = "gen.key" }, []string{`insecure = true with key_file "gen.key"`}},
		{"secret_key", func(c *node.Config) { c.SecretKey = z85 }, []string{"insecure = true with secret_key:"}},
		{"peer key", func(c *node.Config) { c.Peers[0].PublicKey = z85 }, []string{"insecure = true with peers[0].public_key:"}},
		{"peer key file and identities", func(c *node.Config) {
			c.Peers[0].PublicKeyFile = "ctx.pub"
			c.Identities = []node.Identity{{Instance: "router", PublicKey: z85}}
		}, []string{`peers[0].public_key_file "ctx.pub" and identities`}},
	} {
		cfg := base()
		c.set(&cfg)
		err := cfg.Validate()
		if !errors.Is(err, node.ErrConfig) {
			t.Fatalf("%s with insecure: %v, want ErrConfig", c.name, err)
		}
		for _, w := range append(c.want, "the keys would be ignored") {
			if !strings.Contains(err.Error(), w) {
				t.Fatalf("%s with insecure: %v, want it to contain %q", c.name, err, w)
			}
		}
		if strings.Contains(err.Error(), z85) {
			t.Fatalf("%s with insecure: the error shows a key: %v", c.name, err)
		}
	}
}
