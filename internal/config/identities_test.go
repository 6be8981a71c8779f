package config

import (
	"slices"
	"strings"
	"testing"
)

// Two well-formed Z85 keys ('=' and '/' are Z85 characters: a key may
// contain them, and the parser takes the last 40 characters as the key).
const (
	keyA = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"
	keyB = "Yne@$w-vo<fVvi]a<NY6T1ed:M$fCG*[IaLV{hID"
)

// TestCurveIdentities: the curve-identities key binds CURVE keys to the
// instance and ranks each may speak for, from the file (one per line in a
// block scalar), the environment or a flag; a malformed entry is an
// *Error naming it.
func TestCurveIdentities(t *testing.T) {
	file := "curve-identities: |\n  gen/0-2,5=" + keyA + "\n  ctx=" + keyB + "\n"
	s, err := fixture(t, file, nil, nil, nil).Load(CurveIdentities)
	if err != nil {
		t.Fatal(err)
	}
	want := []CurveIdentity{{PublicKey: keyA, Instance: "gen", Ranks: []int32{0, 1, 2, 5}}, {PublicKey: keyB, Instance: "ctx"}}
	if !slices.EqualFunc(s.CurveIdentities, want, func(a, b CurveIdentity) bool {
		return a.PublicKey == b.PublicKey && a.Instance == b.Instance && slices.Equal(a.Ranks, b.Ranks)
	}) {
		t.Fatalf("CurveIdentities = %+v, want %+v", s.CurveIdentities, want)
	}
	s, err = fixture(t, "", map[string]string{"KVXFER_CURVE_IDENTITIES": "x/3=" + keyA + ";y=" + keyB}, nil, nil).Load(CurveIdentities)
	if err != nil || len(s.CurveIdentities) != 2 || s.CurveIdentities[0].Instance != "x" || !slices.Equal(s.CurveIdentities[0].Ranks, []int32{3}) {
		t.Fatalf("from the environment: %+v, %v", s.CurveIdentities, err)
	}
	s, err = fixture(t, "", nil, []string{"--curve-identities", "gen=" + keyA}, nil).Load(CurveIdentities)
	if err != nil || len(s.CurveIdentities) != 1 || s.CurveIdentities[0].PublicKey != keyA {
		t.Fatalf("from a flag: %+v, %v", s.CurveIdentities, err)
	}
	for raw, why := range map[string]string{
		";":                        "no identity",
		"gen=short":                "40-character Z85 key",
		"gen=" + keyA[:39] + "~":   "not Z85",
		"=" + keyA:                 "40-character",
		"/0=" + keyA:               "empty instance",
		"gen/x=" + keyA:            `rank "x"`,
		"gen/3-1=" + keyA:          "runs backwards",
		"gen/65536=" + keyA:        "from 0 to 65535",
		"gen/0=" + keyA + " ctx=k": "identity 2",
	} {
		_, err := fixture(t, "", map[string]string{"KVXFER_CURVE_IDENTITIES": raw}, nil, nil).Load(CurveIdentities)
		if !IsInvalid(err) || !strings.Contains(err.Error(), why) || !strings.Contains(err.Error(), "KVXFER_CURVE_IDENTITIES") {
			t.Errorf("%q: %v, want an *Error about %q", raw, err, why)
		}
	}
}
