package config

import (
	"errors"
	"strings"
	"testing"
)

// TestSecondDocumentRefused: a --config file of more than one YAML
// document is refused, naming the file and the line where the next one
// begins and saying that only one document is read. Before, the decoder
// read the first document alone: "workers: 2" loaded, and the second
// document's bad value and misspelt key were ignored without a word.
func TestSecondDocumentRefused(t *testing.T) {
	for _, c := range []struct {
		name, file, want string
	}{
		{"bad settings after ---", "workers: 2\n---\nworkers: abc\nwrokers: 8\n",
			"kvxfer.yaml:2: a YAML document after the first: only one document is read"},
		{"good settings after ---", "workers: 2\n---\npool: 64MiB\n",
			"kvxfer.yaml:2: a YAML document after the first: only one document is read"},
		{"a third document after an empty second", "workers: 2\n---\n---\n# more\npool: 64MiB\n",
			"kvxfer.yaml:3: a YAML document after the first: only one document is read"},
		{"not YAML after ---", "workers: 2\n---\nworkers: [4\n", "kvxfer.yaml: "},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, err := fixture(t, c.file, nil, nil, nil).Load()
			if err == nil {
				t.Fatalf("loaded workers %d from %s; want an error containing %q", s.Workers, s.Origin(Workers).Where, c.want)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q\nwant it to contain %q", err, c.want)
			}
			var ce *Error
			if !errors.As(err, &ce) || !errors.Is(err, ErrInvalid) {
				t.Errorf("error %T does not unwrap to *Error and ErrInvalid", err)
			}
		})
	}
}

// TestEmptyTrailingDocumentAccepted: a document with nothing in it after
// the first (a file ending in "---", or in "---" and comments) sets
// nothing, so nothing of it would be ignored: the file loads as its first
// document. So does one that opens with "---".
func TestEmptyTrailingDocumentAccepted(t *testing.T) {
	for _, file := range []string{
		"workers: 2\n---\n",
		"workers: 2\n---\n# nothing here\n",
		"workers: 2\n---\n~\n",
		"---\nworkers: 2\n",
		"workers: 2\n...\n",
	} {
		s, err := fixture(t, file, nil, nil, nil).Load()
		if err != nil {
			t.Errorf("%q: %v", file, err)
			continue
		}
		want(t, s.Workers, 2, s.Origin(Workers).Source, SourceFile)
	}
}
