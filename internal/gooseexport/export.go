// Package gooseexport copies pgdedup's goose migrations into a host service's
// own goose migrations directory, numbered after the host's, so that the host's
// goose CLI applies them as they are.
//
// Copying pgdedup's files unchanged fails with the goose CLI in the two
// commonest cases. A host with sequential versions already has a 00001, and
// goose panics on the duplicate version. A host whose migrations are applied
// is past version 2, and goose refuses "missing" migrations below its current
// version unless run with -allow-missing. So each file is written under a
// version after the directory's newest (or after one the user gives), in the
// directory's own style. That is sequential (00007_…) as `goose create -s`
// numbers, or a timestamp (20261201103000_…) as plain `goose create` does, so
// that `goose fix` treats them like the host's own. The content is pgdedup's
// file unchanged after a header comment, so its annotations (NO TRANSACTION,
// StatementBegin) still apply.
//
// Each file's name keeps pgdedup's own name after "pgdedup_"
// (00007_pgdedup_00001_processed_messages.sql), which is how a later export, after a
// pgdedup upgrade, knows which migrations the directory already has and writes
// only the new ones.
package gooseexport

import (
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// File is one migration an export writes or found.
type File struct {
	Source string // pgdedup's name, such as 00001_processed_messages.sql
	Name   string // its name in the host's directory
}

// Plan is what an export does.
type Plan struct {
	Write   []File // to write, in pgdedup's order
	Present []File // already in the directory
}

// timestampLayout is goose's version layout for timestamps (goose create).
const timestampLayout = "20060102150405"

// exported matches the name of a file an export wrote. Group 1 is pgdedup's
// name.
var exported = regexp.MustCompile(`^[0-9]+_pgdedup_([0-9]+_.+\.sql)$`)

// NewPlan works out which of the migrations in src (goose SQL files named
// NNNNN_name.sql at its root) dir lacks, and the names they get there. Their
// versions follow after, or, when after is 0, the newest version in dir. now is
// the time a timestamp-versioned directory's next version starts from, as goose
// create would number it.
func NewPlan(src fs.FS, dir string, after int64, now time.Time) (*Plan, error) {
	if after < 0 {
		return nil, fmt.Errorf("the version to number after must not be negative, got %d", after)
	}
	sources, err := fs.Glob(src, "*.sql")
	if err != nil {
		return nil, err
	}
	slices.Sort(sources)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read the goose migrations directory: %w", err)
	}

	byVersion := map[int64][]string{} // the directory's files by version, to refuse duplicates
	present := map[string]string{}    // pgdedup's name → its file in dir
	var newest int64
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || filepath.Ext(name) != ".sql" && filepath.Ext(name) != ".go" {
			continue
		}
		v, ok := version(name)
		if !ok {
			continue // goose ignores it too, or reports it itself
		}
		byVersion[v] = append(byVersion[v], name)
		newest = max(newest, v)
		if m := exported.FindStringSubmatch(name); m != nil {
			present[m[1]] = name
		} else if slices.Contains(sources, name) {
			present[name] = name // copied as it was, as the README once said
		}
	}
	plan := &Plan{}
	for _, s := range sources {
		if name, ok := present[s]; ok {
			v, _ := version(name)
			if same := byVersion[v]; len(same) > 1 {
				return nil, fmt.Errorf("%s, a copy of pgdedup's %s, has the version of %s: goose refuses duplicate versions. "+
					"Delete %[1]s (goose cannot have applied it) and export again", name, s, strings.Join(slices.DeleteFunc(same, func(n string) bool { return n == name }), ", "))
			}
			plan.Present = append(plan.Present, File{Source: s, Name: name})
			continue
		}
		plan.Write = append(plan.Write, File{Source: s})
	}
	if len(plan.Write) == 0 {
		return plan, nil
	}

	if after != 0 && after < newest {
		return nil, fmt.Errorf("version %d is below the directory's newest, %d (%s): on a database already there, "+
			"goose would refuse the new files as missing; number after %[2]d or later", after, newest, strings.Join(byVersion[newest], ", "))
	}
	base := max(after, newest)
	if n := int64(len(plan.Write)); base > math.MaxInt64-n {
		from := "--after"
		if base == newest && after != newest {
			from = "the directory's newest version (" + strings.Join(byVersion[newest], ", ") + ")"
		}
		return nil, fmt.Errorf("cannot number %d migrations after version %d, %s: goose versions are 64-bit integers, "+
			"at most %d; number after a smaller version", n, base, from, int64(math.MaxInt64))
	}
	next := sequential(base)
	if isTimestamp(base) {
		next = timestamps(base, after == 0, now)
	}
	for i := range plan.Write {
		plan.Write[i].Name = next() + "_pgdedup_" + plan.Write[i].Source
	}
	return plan, nil
}

// Apply writes the plan's files into dir, each pgdedup's source from src
// after a header comment. It never overwrites a file.
func (p *Plan) Apply(src fs.FS, dir string) error {
	for _, f := range p.Write {
		body, err := fs.ReadFile(src, f.Source)
		if err != nil {
			return err
		}
		header := fmt.Sprintf("-- pgdedup's migration %s, exported by `pgdedup migrate sql --goose-dir`\n"+
			"-- with a version after this directory's. Keep \"pgdedup_%s\" in the name:\n"+
			"-- it tells the next export this migration is here.\n\n",
			f.Source, strings.TrimSuffix(f.Source, ".sql"))
		path := filepath.Join(dir, f.Name)
		out, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err != nil {
			return err
		}
		_, err = out.WriteString(header + string(body))
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("write %s: %w", path, err)
		}
	}
	return nil
}

// version is goose's NumericComponent, the positive number before the first
// underscore of the file's name.
func version(name string) (int64, bool) {
	before, _, ok := strings.Cut(name, "_")
	if !ok {
		return 0, false
	}
	v, err := strconv.ParseInt(before, 10, 64)
	return v, err == nil && v > 0
}

// isTimestamp is goose's test (goose fix, create -s) for a version that reads
// as a time in the timestamp layout, after 1970.
func isTimestamp(v int64) bool {
	t, err := time.Parse(timestampLayout, strconv.FormatInt(v, 10))
	return err == nil && t.After(time.Unix(0, 0))
}

// sequential numbers after base as goose create -s does (00001, 00002, ...).
func sequential(base int64) func() string {
	return func() string {
		base++
		return fmt.Sprintf("%05d", base)
	}
}

// timestamps numbers one second apart after base, so every version is still a
// valid timestamp. They start from now rather than base+1s when fromNow and
// now is later, as goose create would name a new file.
func timestamps(base int64, fromNow bool, now time.Time) func() string {
	t, _ := time.Parse(timestampLayout, strconv.FormatInt(base, 10))
	t = t.Add(time.Second)
	if now = now.UTC().Truncate(time.Second); fromNow && now.After(t) {
		t = now
	}
	return func() string {
		text := t.Format(timestampLayout)
		t = t.Add(time.Second)
		return text
	}
}
