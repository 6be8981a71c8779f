package config

import (
	"fmt"

	"github.com/spf13/pflag"
)

// rawValue is a key's flag: it keeps the text given and leaves checking it
// to Load, so that a bad flag fails with the same message as a bad
// variable or file entry.
type rawValue struct {
	s   string
	typ string
}

func (v *rawValue) String() string     { return v.s }
func (v *rawValue) Set(s string) error { v.s = s; return nil }
func (v *rawValue) Type() string       { return v.typ }

// AddFlags registers --NAME for each named key on fs; defaults holds the
// command's defaults (shown in the help), falling back to the key's.
func AddFlags(fs *pflag.FlagSet, defaults map[string]string, names ...string) {
	for _, name := range names {
		k, ok := KeyNamed(name)
		if !ok {
			panic(fmt.Sprintf("config.AddFlags: no key %q", name))
		}
		def, ok := defaults[name]
		if !ok {
			def = k.Default
		}
		usage := k.Usage + " [" + k.Env + "]"
		if def == "" && k.DefaultDoc != "" {
			usage += " (default: " + k.DefaultDoc + ")"
		}
		fs.Var(&rawValue{s: def, typ: k.Type}, k.Name, usage)
	}
}
