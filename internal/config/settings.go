package config

import (
	"errors"
	"fmt"
	"time"

	"github.com/rs/zerolog"
)

// ErrInvalid is wrapped by every *Error.
var ErrInvalid = errors.New("invalid configuration")

// Source is where a setting's value came from.
type Source uint8

// Sources, from weakest to strongest.
const (
	SourceDefault Source = iota
	SourceFile
	SourceEnv
	SourceFlag
)

func (s Source) String() string {
	switch s {
	case SourceDefault:
		return "default"
	case SourceFile:
		return "file"
	case SourceEnv:
		return "env"
	case SourceFlag:
		return "flag"
	}
	return fmt.Sprintf("Source(%d)", uint8(s))
}

// Origin is where one setting's value came from: its source, the place
// there (the variable, the flag, "FILE:LINE"), and the value as written.
type Origin struct {
	Source Source
	Where  string
	Raw    string
}

// Error is an invalid value: Where (KVXFER_WORKERS, --workers,
// kvxfer.yaml:3: workers, "default workers") holds Raw, which is invalid
// because of Reason. An unknown file key has Raw "" and Key the unknown name.
type Error struct {
	Key    string
	Source Source
	Where  string
	Raw    string
	Reason string
}

func (e *Error) Error() string {
	if e.Raw == "" && e.Reason != "" && e.Key == "" {
		return e.Where + ": " + e.Reason
	}
	return fmt.Sprintf("%s = %q: %s", e.Where, e.Raw, e.Reason)
}

// Unwrap makes errors.Is(err, ErrInvalid) hold.
func (e *Error) Unwrap() error { return ErrInvalid }

// Settings are the resolved values of the keys a command loaded. A key the
// command did not load, or that no source set, keeps its zero value (see
// Set).
type Settings struct {
	Model          string
	Pool           uint64
	TokensPerBlock int
	Workers        int
	Backend        string
	Timeout        time.Duration
	LogLevel       zerolog.Level
	MetricsAddr    string
	// CurveIdentities bind CURVE client keys to the instance (and ranks)
	// each may speak for (key curve-identities).
	CurveIdentities []CurveIdentity
	// File is the YAML file read ("" when none).
	File string
	// Warnings are things worth logging that are not errors (an unknown
	// KVXFER_ variable).
	Warnings []string

	origins map[string]Origin
}

// Set reports whether some source (a default included) gave key a value.
func (s *Settings) Set(key string) bool {
	_, ok := s.origins[key]
	return ok
}

// Origin is where key's value came from.
func (s *Settings) Origin(key string) Origin { return s.origins[key] }

// Invalid returns an *Error for a value of key that parsed but that the
// command cannot use, naming where the value came from:
// s.Invalid("backend", "kvxfer ctx needs shm").
func (s *Settings) Invalid(key, reason string) error {
	o := s.origins[key]
	return &Error{Key: key, Source: o.Source, Where: where(key, o), Raw: o.Raw, Reason: reason}
}

// Describe lists every loaded key as "key=value (source)", for a debug
// log line.
func (s *Settings) Describe() map[string]string {
	out := make(map[string]string, len(s.origins))
	for k, o := range s.origins {
		out[k] = fmt.Sprintf("%s (%s)", o.Raw, where(k, o))
	}
	return out
}

// where names the place a value came from as error messages show it.
func where(key string, o Origin) string {
	switch o.Source {
	case SourceDefault:
		return "default " + key
	case SourceFile:
		return o.Where + ": " + key
	}
	return o.Where
}
