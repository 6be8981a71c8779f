package config

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"

	"github.com/kvxfer/kvxfer/messages"
)

// CurveIdentity binds a CURVE public key to the engine instance (and
// ranks) it may speak for: the control plane rejects a frame whose sender
// its key is not bound to (control/zmq Curve.Identities).
type CurveIdentity struct {
	// PublicKey is the Z85 key (40 characters), as `kvxfer keygen` writes.
	PublicKey string
	// Instance is the engine instance the key speaks for.
	Instance string
	// Ranks are the ranks it may speak as; empty: every rank.
	Ranks []int32
}

// z85 is ZeroMQ's Z85 alphabet (RFC 32), in which CURVE keys are written.
const z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"

const keyLen = 40

// parseIdentities parses the curve-identities value: entries
// INSTANCE[/RANKS]=KEY separated by ';' or white space (a YAML block
// scalar may put one per line); RANKS is a comma-separated list of ranks
// and ranges (0,2-3). A key's 40 characters are the last of its entry
// (Z85 has '=' and '/' in it). It returns why raw is invalid ("" when it
// is valid).
func parseIdentities(raw string) ([]CurveIdentity, string) {
	entries := strings.FieldsFunc(raw, func(r rune) bool { return r == ';' || unicode.IsSpace(r) })
	if len(entries) == 0 {
		return nil, "no identity (want INSTANCE[/RANKS]=KEY; ...)"
	}
	out := make([]CurveIdentity, 0, len(entries))
	for i, e := range entries {
		id, why := parseIdentity(e)
		if why != "" {
			return nil, fmt.Sprintf("identity %d (%q): %s", i+1, e, why)
		}
		out = append(out, id)
	}
	return out, ""
}

func parseIdentity(e string) (CurveIdentity, string) {
	if len(e) < keyLen+2 || e[len(e)-keyLen-1] != '=' {
		return CurveIdentity{}, fmt.Sprintf("want INSTANCE[/RANKS]=KEY with a %d-character Z85 key", keyLen)
	}
	who, key := e[:len(e)-keyLen-1], e[len(e)-keyLen:]
	for i := 0; i < len(key); i++ {
		if !strings.ContainsRune(z85, rune(key[i])) {
			return CurveIdentity{}, fmt.Sprintf("key character %q is not Z85", key[i])
		}
	}
	instance, ranks, hasRanks := strings.Cut(who, "/")
	switch {
	case instance == "":
		return CurveIdentity{}, "empty instance"
	case len(instance) > messages.MaxInstanceLen:
		return CurveIdentity{}, fmt.Sprintf("instance of %d characters, want at most %d", len(instance), messages.MaxInstanceLen)
	case strings.ContainsAny(instance, "="):
		return CurveIdentity{}, "instance contains '='"
	}
	id := CurveIdentity{PublicKey: key, Instance: instance}
	if !hasRanks {
		return id, ""
	}
	seen := map[int32]bool{}
	for _, part := range strings.Split(ranks, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		if !isRange {
			hi = lo
		}
		a, why := parseRank(lo)
		if why != "" {
			return CurveIdentity{}, why
		}
		b, why := parseRank(hi)
		if why != "" {
			return CurveIdentity{}, why
		}
		if b < a {
			return CurveIdentity{}, fmt.Sprintf("rank range %s runs backwards", part)
		}
		for r := a; r <= b; r++ {
			if !seen[r] {
				seen[r] = true
				id.Ranks = append(id.Ranks, r)
			}
		}
	}
	return id, ""
}

func parseRank(s string) (int32, string) {
	n, err := strconv.ParseInt(s, 10, 32)
	if err != nil || n < 0 || n >= messages.MaxRank {
		return 0, fmt.Sprintf("rank %q is not a number from 0 to %d", s, messages.MaxRank-1)
	}
	return int32(n), ""
}
