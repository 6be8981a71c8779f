package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/spf13/pflag"
	"gopkg.in/yaml.v3"
)

// Loader resolves settings for one command.
type Loader struct {
	// File is the YAML file to read; "" reads none.
	File string
	// FileFrom is what named File, as its error says it: "--config" (also
	// when ""), or ConfigEnv.
	FileFrom string
	// Env looks a variable up (os.LookupEnv); nil reads no environment.
	Env func(string) (string, bool)
	// Environ lists the environment as KEY=VALUE (os.Environ), to warn of
	// unknown KVXFER_ variables; nil skips the check.
	Environ func() []string
	// Flags are the command's parsed flags; keys are taken from those
	// registered with AddFlags and changed on the command line.
	Flags *pflag.FlagSet
	// Defaults override the keys' built-in defaults for this command.
	Defaults map[string]string
}

// FromOS is a Loader on the process environment and flags fs; file is the
// --config value (when "", KVXFER_CONFIG names the file, if set).
func FromOS(file string, fs *pflag.FlagSet) Loader {
	from := "--config"
	if file == "" {
		file, from = os.Getenv(ConfigEnv), ConfigEnv
	}
	return Loader{File: file, FileFrom: from, Env: os.LookupEnv, Environ: os.Environ, Flags: fs}
}

// Load resolves keys (every key when none is named) from the defaults, the
// file, the environment and the flags, in that order of precedence. Every
// value any source gives for any known key is checked, not only those of
// keys; the first invalid one is returned as an *Error. Values of the other
// keys are checked but not kept.
func (l Loader) Load(keys ...string) (Settings, error) { return l.load(true, keys) }

// LoadOnly is Load that checks only the values of keys (the file's
// structure and its key names are still checked): for a command that
// uses none of the engine's settings, a bad KVXFER_WORKERS is no concern.
func (l Loader) LoadOnly(keys ...string) (Settings, error) { return l.load(false, keys) }

func (l Loader) load(strict bool, keys []string) (Settings, error) {
	if len(keys) == 0 {
		for _, k := range Keys {
			keys = append(keys, k.Name)
		}
	}
	for _, name := range keys {
		if _, ok := KeyNamed(name); !ok {
			return Settings{}, fmt.Errorf("config: no key %q", name) // a programming error
		}
	}
	s := Settings{File: l.File, origins: map[string]Origin{}}
	var scratch Settings // where values of keys not loaded are checked
	set := func(k Key, o Origin) error {
		dst := &scratch
		if slices.Contains(keys, k.Name) {
			dst = &s
		} else if !strict {
			return nil
		}
		if why := k.apply(dst, o.Raw); why != "" {
			return &Error{Key: k.Name, Source: o.Source, Where: where(k.Name, o), Raw: o.Raw, Reason: why}
		}
		if dst == &s {
			s.origins[k.Name] = o
		}
		return nil
	}

	// 1. Defaults.
	for _, k := range Keys {
		def, ok := l.Defaults[k.Name]
		if !ok {
			def = k.Default
		}
		if def == "" || !slices.Contains(keys, k.Name) {
			continue
		}
		if err := set(k, Origin{Source: SourceDefault, Raw: def}); err != nil {
			return s, err
		}
	}
	// 2. The file.
	if l.File != "" {
		entries, err := readFile(l.File, l.FileFrom)
		if err != nil {
			return s, err
		}
		for _, e := range entries {
			if err := set(e.key, Origin{Source: SourceFile, Where: e.where, Raw: e.raw}); err != nil {
				return s, err
			}
		}
	}
	// 3. The environment.
	if l.Env != nil {
		for _, k := range Keys {
			if v, ok := l.Env(k.Env); ok && v != "" {
				if err := set(k, Origin{Source: SourceEnv, Where: k.Env, Raw: v}); err != nil {
					return s, err
				}
			}
		}
	}
	if l.Environ != nil {
		s.Warnings = append(s.Warnings, unknownEnv(l.Environ())...)
	}
	// 4. The flags given on the command line.
	if l.Flags != nil {
		for _, k := range Keys {
			f := l.Flags.Lookup(k.Name)
			if f == nil || !f.Changed {
				continue
			}
			if _, ours := f.Value.(*rawValue); !ours {
				continue // a flag of the same name that is not this key
			}
			if err := set(k, Origin{Source: SourceFlag, Where: "--" + k.Name, Raw: f.Value.String()}); err != nil {
				return s, err
			}
		}
	}
	return s, nil
}

// OtherEnv are the KVXFER_ variables kvxfer reads that are not keys: each
// is read where it acts (the package named), not through a Loader, so the
// Loader does not warn of them. docs/configuration.md documents them.
var OtherEnv = []string{
	"KVXFER_SYSMON",         // internal/sysmon.OptOut: "deep" keeps the runtime's sysmon default
	"KVXFER_GC_FLOOR",       // internal/gcfloor.Env: the collector's heap floor, or "off"
	"KVXFER_LIBCUDA",        // cuda.LibraryEnv: the CUDA driver library to load
	"KVXFER_LIB",            // the Python package's libkvxfer.so (python/kvxfer)
	"KVXFER_SGLANG_CONFIG",  // the Python package's SGLang config (python/kvxfer/sglang.py)
	"KVXFER_TRTLLM_CONFIG",  // the Python package's TensorRT-LLM config (python/kvxfer/trtllm.py)
	"KVXFER_HOPTRACE",       // internal/hoptrace (kvxfer_hoptrace builds): where to dump hop logs
	"KVXFER_RDMABENCH_PEER", // rdma/rdmabench.PeerEnv: set by bench raw --peer-process for its receiver
	"KVXFER_DEMO_CHILD",     // cmd/kvxfer: set by a demo for the processes it starts (a second signal does not force them out)
}

// unknownEnv warns of KVXFER_ variables that name no key and are not
// OtherEnv.
func unknownEnv(environ []string) []string {
	var out []string
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, "KVXFER_") || name == ConfigEnv || slices.Contains(OtherEnv, name) {
			continue
		}
		if _, ok := keyByEnv(name); !ok {
			out = append(out, fmt.Sprintf("%s is not a kvxfer setting (known: %s)", name, knownEnv()))
		}
	}
	sort.Strings(out)
	return out
}

func knownEnv() string {
	names := []string{ConfigEnv}
	for _, k := range Keys {
		names = append(names, k.Env)
	}
	return strings.Join(append(names, OtherEnv...), ", ")
}

// fileEntry is one key of the YAML file.
type fileEntry struct {
	key   Key
	where string // FILE:LINE
	raw   string
}

// readFile reads the YAML file: one flat mapping of known keys to scalars.
// from is what named it (Loader.FileFrom): a file that cannot be read is
// named with it. It was always "--config", also of a file that
// KVXFER_CONFIG named, which the user then looked for on a command line
// that had none.
func readFile(path, from string) ([]fileEntry, error) {
	b, err := os.ReadFile(filepath.Clean(path))
	if err != nil {
		if from == "" {
			from = "--config"
		}
		fix := "give --config a readable YAML settings file"
		if from == ConfigEnv {
			fix = "set " + ConfigEnv + " to a readable YAML settings file, or unset it"
		}
		return nil, fmt.Errorf("%w: %s = %q: %w: %s (docs/configuration.md)", ErrInvalid, from, path, err, fix)
	}
	return parseFile(path, b)
}

func parseFile(path string, b []byte) ([]fileEntry, error) {
	name := filepath.Base(path)
	fail := func(line int, why string) error {
		return &Error{Source: SourceFile, Where: fmt.Sprintf("%s:%d", name, line), Reason: why}
	}
	if len(bytes.TrimSpace(b)) == 0 {
		return nil, nil // an empty file sets nothing
	}
	badYAML := func(err error) error {
		return &Error{Source: SourceFile, Where: name, Reason: strings.TrimPrefix(err.Error(), "yaml: ")}
	}
	// A decoder, not yaml.Unmarshal: Unmarshal reads the first document
	// and drops the rest without a word, so the settings of a second
	// document (after a "---" line) were ignored, typos and bad values
	// unseen, the user believing them applied.
	dec := yaml.NewDecoder(bytes.NewReader(b))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil && !errors.Is(err, io.EOF) {
		return nil, badYAML(err)
	}
	for {
		var next yaml.Node
		err := dec.Decode(&next)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, badYAML(err)
		}
		// A document with nothing in it (a file that ends in "---", or
		// one that holds only comments after it) sets nothing, so
		// nothing of it is ignored.
		if !emptyDocument(&next) {
			return nil, fail(next.Line, "a YAML document after the first: only one document is read, so its settings would be ignored; put every setting in one mapping")
		}
	}
	if emptyDocument(&doc) {
		return nil, nil // only comments
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 {
		return nil, fail(1, "want a mapping of settings (key: value)")
	}
	m := doc.Content[0]
	if m.Kind != yaml.MappingNode {
		return nil, fail(m.Line, "want a mapping of settings (key: value)")
	}
	var out []fileEntry
	seen := map[string]int{}
	for i := 0; i+1 < len(m.Content); i += 2 {
		kn, vn := m.Content[i], m.Content[i+1]
		k, ok := KeyNamed(kn.Value)
		if !ok {
			return nil, fail(kn.Line, fmt.Sprintf("unknown key %q (known: %s)", kn.Value, knownKeys()))
		}
		if line, dup := seen[k.Name]; dup {
			return nil, fail(kn.Line, fmt.Sprintf("key %q repeated (first on line %d)", k.Name, line))
		}
		seen[k.Name] = kn.Line
		at := fmt.Sprintf("%s:%d", name, kn.Line)
		if vn.Kind != yaml.ScalarNode || vn.Tag == "!!null" {
			return nil, &Error{Key: k.Name, Source: SourceFile, Where: at + ": " + k.Name, Raw: yamlText(vn),
				Reason: "want a single value"}
		}
		out = append(out, fileEntry{key: k, where: at, raw: vn.Value})
	}
	return out, nil
}

// emptyDocument reports whether the decoded document doc sets nothing: no
// document at all, or one of only comments (a null).
func emptyDocument(doc *yaml.Node) bool {
	if doc.Kind == 0 || (doc.Kind == yaml.DocumentNode && len(doc.Content) == 0) {
		return true
	}
	if doc.Kind == yaml.DocumentNode && len(doc.Content) == 1 {
		m := doc.Content[0]
		return m.Kind == yaml.ScalarNode && m.Tag == "!!null"
	}
	return false
}

func knownKeys() string {
	names := make([]string, len(Keys))
	for i, k := range Keys {
		names[i] = k.Name
	}
	return strings.Join(names, ", ")
}

// yamlText renders a non-scalar node compactly for an error message.
func yamlText(n *yaml.Node) string {
	if n.Tag == "!!null" {
		return ""
	}
	b, err := yaml.Marshal(n)
	if err != nil {
		return n.Value
	}
	return strings.TrimSpace(strings.ReplaceAll(string(b), "\n", " "))
}

// IsInvalid reports whether err is a configuration error.
func IsInvalid(err error) bool { return errors.Is(err, ErrInvalid) }
