package pgdedup_test

import (
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"
)

// The project's budget for hand-written Markdown, in words as wc -w counts
// them: docs that a reader can hold in mind, and that stay true.
const (
	markdownWordBudget = 13_900 // 12,000, plus docs/errors.md's table of every error, the rollout order, the alerting rules (issue 27), the threat model's adoption rule (issue 26), the architecture page (issue 28), bounded and fresh claims (on Citus too) with the time each integration passes, and the WAL model and the claims-with-a-time steady runs, with where a window falls in a span (issue 29)
	readmeWordBudget   = 1_200
)

// generatedMarkdown are the directories whose Markdown a command writes
// (their header names it); they are neither counted nor hand-edited.
var generatedMarkdown = []string{"bench/results"}

// markdownFiles returns the hand-written Markdown of the repository, by path
// from its root.
func markdownFiles(t *testing.T) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != "." && strings.HasPrefix(d.Name(), ".") || slices.Contains(generatedMarkdown, filepath.ToSlash(path)) ||
				d.Name() == "testdata" || d.Name() == "node_modules" {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(path, ".md") {
			files = append(files, filepath.ToSlash(path))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// TestDocsWordBudget keeps the hand-written Markdown within its budget.
// `go test -run TestDocsWordBudget -v .` prints the words per file.
func TestDocsWordBudget(t *testing.T) {
	t.Parallel()
	total := 0
	var table strings.Builder
	for _, f := range markdownFiles(t) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		n := len(strings.Fields(string(b)))
		total += n
		fmt.Fprintf(&table, "%6d  %s\n", n, f)
		if f == "README.md" && n > readmeWordBudget {
			t.Errorf("README.md has %d words, over its budget of %d", n, readmeWordBudget)
		}
	}
	t.Logf("words per hand-written Markdown file:\n%s%6d  total", table.String(), total)
	if total > markdownWordBudget {
		t.Errorf("hand-written Markdown has %d words in all, over the budget of %d:\n%s", total, markdownWordBudget, table.String())
	}
}

var (
	mdLink    = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	mdHeading = regexp.MustCompile("(?m)^#{1,6} +(.+?) *#*$")
	mdFence   = regexp.MustCompile("(?ms)^```.*?^```")
)

// TestDocsLinksResolve checks every relative link of the hand-written
// Markdown: the file or directory exists, and a #fragment names a heading
// of the file it points to (as GitHub makes anchors of headings).
func TestDocsLinksResolve(t *testing.T) {
	t.Parallel()
	for _, f := range markdownFiles(t) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		text := mdFence.ReplaceAllString(string(b), "")
		for _, m := range mdLink.FindAllStringSubmatch(text, -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			path, fragment, _ := strings.Cut(target, "#")
			resolved := f
			if path != "" {
				resolved = filepath.ToSlash(filepath.Join(filepath.Dir(f), path))
				if _, err := os.Stat(resolved); err != nil {
					t.Errorf("%s links to %s, which does not exist", f, target)
					continue
				}
			}
			if fragment == "" || !strings.HasSuffix(resolved, ".md") {
				continue
			}
			if !slices.Contains(anchors(t, resolved), fragment) {
				t.Errorf("%s links to %s: %s has no heading with the anchor #%s", f, target, resolved, fragment)
			}
		}
	}
}

// anchors returns the GitHub anchors of path's headings.
func anchors(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	seen := map[string]int{}
	for _, m := range mdHeading.FindAllStringSubmatch(mdFence.ReplaceAllString(string(b), ""), -1) {
		var a strings.Builder
		for _, r := range strings.ToLower(m[1]) {
			switch {
			case r == ' ':
				a.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsNumber(r):
				a.WriteRune(r)
			}
		}
		anchor := a.String()
		if n := seen[anchor]; n > 0 {
			seen[anchor]++
			anchor = fmt.Sprintf("%s-%d", anchor, n)
		} else {
			seen[anchor] = 1
		}
		out = append(out, anchor)
	}
	return out
}

// readmeProgram wraps the README's example in a function with what it
// assumes in scope: a pool, a context and a channel of deliveries whose
// fields and methods are those of an AMQP delivery.
const readmeProgram = `package main

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pgdedup/pgdedup"
)

type delivery struct {
	MessageId, OrderID string
	Amount             int
}

func (delivery) Ack(multiple bool) error            { return nil }
func (delivery) Nack(multiple, requeue bool) error { return nil }

func consume(ctx context.Context, pool *pgxpool.Pool, deliveries <-chan delivery) error {
%s
	return nil
}

func main() { _ = consume }
`

// TestReadmeExampleCompiles type-checks the README's Go example against this
// checkout, so that an API change cannot leave it behind. It runs go vet in
// a module of its own that replaces pgdedup with the checkout, offline.
func TestReadmeExampleCompiles(t *testing.T) {
	t.Parallel()
	goTool, err := exec.LookPath("go")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("go is not on PATH")
		}
		t.Skip("go is not on PATH")
	}
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)```go\n(.*?)```").FindSubmatch(readme)
	if m == nil {
		t.Fatal("README.md has no Go example")
	}
	root, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	goSum, err := os.ReadFile("go.sum")
	if err != nil {
		t.Fatal(err)
	}
	// The example's module requires what the root module requires (its
	// go.mod lists every module the build needs), so the go command reads no
	// go.mod beyond them: offline, nothing but the root's own downloads is
	// needed (with pgdedup alone required, it would walk the whole graph,
	// down to go.mod files no build here ever downloaded).
	goMod, err := os.ReadFile("go.mod")
	if err != nil {
		t.Fatal(err)
	}
	requires := strings.SplitN(string(goMod), "\nrequire", 2)
	if len(requires) != 2 {
		t.Fatal("go.mod has no require")
	}
	files := map[string]string{
		"go.mod": "module readme\n\ngo 1.26.0\n\nrequire github.com/pgdedup/pgdedup v0.0.0\n\nrequire" + requires[1] +
			"\nreplace github.com/pgdedup/pgdedup => " + root + "\n",
		"go.sum":  string(goSum),
		"main.go": fmt.Sprintf(readmeProgram, m[1]),
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(goTool, "vet", ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod", "GOPROXY=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the README's example does not compile: %v\n%s", err, out)
	}
}

// TestDocsNameExistingTests checks that every test, benchmark, example or
// fuzz target the hand-written Markdown names in backquotes is defined in a
// test file of the repository, so that a rename cannot leave a doc pointing
// at nothing.
func TestDocsNameExistingTests(t *testing.T) {
	t.Parallel()
	var sources strings.Builder
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != "." && strings.HasPrefix(d.Name(), ".") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, "_test.go") {
			b, err := os.ReadFile(path)
			sources.Write(b)
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	named := regexp.MustCompile("`((?:Test|Benchmark|Example|Fuzz)[A-Za-z0-9_]+)`")
	for _, f := range markdownFiles(t) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range named.FindAllSubmatch(b, -1) {
			if !strings.Contains(sources.String(), "func "+string(m[1])+"(") {
				t.Errorf("%s names %s, which no test file defines", f, m[1])
			}
		}
	}
}
