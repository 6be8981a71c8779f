package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// repoRoot is the repository's root, from this package's directory.
const repoRoot = "../.."

// markdownDocs are the documents whose references must resolve: the
// README, the Python package's and docs/.
func markdownDocs(t *testing.T) []string {
	t.Helper()
	docs, err := filepath.Glob(filepath.Join(repoRoot, "docs", "*.md"))
	if err != nil || len(docs) == 0 {
		t.Fatalf("docs/*.md: %v, %d files", err, len(docs))
	}
	return append([]string{filepath.Join(repoRoot, "README.md"), filepath.Join(repoRoot, "python", "README.md")}, docs...)
}

var (
	fenceRe = regexp.MustCompile("(?ms)^\\s*```.*?^\\s*```[^\\n]*$")
	linkRe  = regexp.MustCompile(`\[[^\]]*\]\(([^)\s]+)\)`)
	// mdRe is a Markdown file named in the text ("docs/membership.md",
	// "BENCHMARKS.md"), linked or not.
	mdRe = regexp.MustCompile("(?:^|[\\s(`\"'\\[])([A-Za-z0-9_][A-Za-z0-9_./-]*\\.md)\\b")
	// codePathRe is a path in backquotes ("rdma/ucx/key.go", "test/sim").
	codePathRe = regexp.MustCompile("`([a-z0-9_]+(?:/[A-Za-z0-9_.-]+)+)`")
	headingRe  = regexp.MustCompile(`(?m)^#{1,6}\s+(.*?)\s*#*\s*$`)
)

// anchor is GitHub's anchor of a heading: lower case, punctuation
// dropped, spaces as hyphens.
func anchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 0x7f:
			b.WriteRune(r)
		}
	}
	return b.String()
}

func anchors(t *testing.T, path string) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, m := range headingRe.FindAllStringSubmatch(fenceRe.ReplaceAllString(string(b), ""), -1) {
		out[anchor(m[1])] = true
	}
	return out
}

// isOurCode reports whether a path in backquotes names this repository's
// code: its first element is a directory of the repository and it is Go
// (a package, a .go file, a C header) or the Python package's own
// (other projects' files, python/sglang/…, are named the same way).
func isOurCode(p string) bool {
	first, _, _ := strings.Cut(p, "/")
	if st, err := os.Stat(filepath.Join(repoRoot, first)); err != nil || !st.IsDir() {
		return false
	}
	if first == "python" {
		return strings.HasPrefix(p, "python/kvxfer/") || strings.HasPrefix(p, "python/tests/")
	}
	switch filepath.Ext(p) {
	case "", ".go", ".h", ".c":
		return true
	}
	return false
}

// TestMarkdownReferencesResolve: every relative link of the README,
// python/README.md and docs/*.md names a file of the repository (and a
// heading of it, with an anchor), every Markdown file they name is in the
// repository, and every path of this repository's code they name in
// backquotes exists. (Checked to fail before the README stopped pointing
// to DESIGN.md, a blueprint kept outside the repository: "README.md names
// DESIGN.md, which is not in the repository".)
func TestMarkdownReferencesResolve(t *testing.T) {
	exists := func(p string) bool { _, err := os.Stat(p); return err == nil }
	for _, doc := range markdownDocs(t) {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		name, _ := filepath.Rel(repoRoot, doc)
		dir := filepath.Dir(doc)
		text := fenceRe.ReplaceAllString(string(b), "")
		for _, m := range linkRe.FindAllStringSubmatch(text, -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, frag, _ := strings.Cut(target, "#")
			path := doc
			if file != "" {
				path = filepath.Join(dir, file)
				if !exists(path) {
					t.Errorf("%s links to %s, which is not in the repository", name, target)
					continue
				}
			}
			if frag != "" && strings.HasSuffix(path, ".md") && !anchors(t, path)[frag] {
				t.Errorf("%s links to %s: no heading of %s has anchor #%s", name, target, file, frag)
			}
		}
		for _, m := range mdRe.FindAllStringSubmatch(text, -1) {
			if p := m[1]; !exists(filepath.Join(repoRoot, p)) && !exists(filepath.Join(dir, p)) {
				t.Errorf("%s names %s, which is not in the repository", name, p)
			}
		}
		for _, m := range codePathRe.FindAllStringSubmatch(text, -1) {
			if p := m[1]; isOurCode(p) && !exists(filepath.Join(repoRoot, p)) {
				t.Errorf("%s names `%s`, which is not in the repository", name, p)
			}
		}
	}
}

// TestAnchor: the heading anchors the test above checks links against.
func TestAnchor(t *testing.T) {
	for h, want := range map[string]string{
		"From Python":                          "from-python",
		"Loading it from vLLM's configuration": "loading-it-from-vllms-configuration",
		"2. vLLM: `KVConnectorBase_V1`":        "2-vllm-kvconnectorbase_v1",
		"Keys and endpoints (`ctx`, `gen`)":    "keys-and-endpoints-ctx-gen",
	} {
		if got := anchor(h); got != want {
			t.Errorf("anchor(%q) = %q, want %q", h, got, want)
		}
	}
}

// TestReadmeCommandsParse: every kvxfer command line the README shows
// (its indented examples) names a command and flags the CLI has: each is
// run with --help appended, which parses every flag and runs nothing.
func TestReadmeCommandsParse(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, "    kvxfer ") {
			continue
		}
		line, _, _ = strings.Cut(line, "#")
		for _, c := range strings.Split(line, "&&") {
			args := strings.Fields(c)
			if len(args) == 0 || args[0] != "kvxfer" {
				t.Errorf("README: %q is not a kvxfer command", c)
				continue
			}
			n++
			if _, stderr, err := runApp(newApp(), append(args[1:], "--help")...); err != nil {
				t.Errorf("README: %s: %v\n%s", strings.TrimSpace(c), err, stderr)
			}
		}
	}
	if n < 6 {
		t.Fatalf("found %d kvxfer commands in the README, want the by-hand and etcd examples' (6 or more): the pattern is stale", n)
	}
}
