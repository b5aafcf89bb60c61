package cli

import (
	"fmt"
	"io/fs"
	"slices"
	"strings"

	"github.com/pgdedup/pgdedup"
)

// migrationSQL prints the embedded migrations as plain SQL that psql or any
// migration tool can run. goose's annotations are dropped, and only the Up
// (or, with down, the Down) sections are kept. Each file runs in a transaction
// of its own as goose would run it, and the Down sections come newest first.
func (c *command) migrationSQL(down bool) int {
	names, err := fs.Glob(pgdedup.Migrations(), "*.sql")
	if err != nil {
		return c.fail(err)
	}
	slices.Sort(names)
	direction := "up"
	if down {
		direction = "down"
		slices.Reverse(names)
	}
	for i, name := range names {
		src, err := fs.ReadFile(pgdedup.Migrations(), name)
		if err != nil {
			return c.fail(err)
		}
		body, inTx := section(string(src), down)
		if i > 0 {
			fmt.Fprintln(c.stdout)
		}
		fmt.Fprintf(c.stdout, "-- pgdedup migration %s (%s)\n", name, direction)
		if inTx {
			fmt.Fprintln(c.stdout, "BEGIN;")
		}
		fmt.Fprint(c.stdout, body)
		if inTx {
			fmt.Fprintln(c.stdout, "COMMIT;")
		}
	}
	return exitOK
}

// gooseAnnotation reads line as a goose annotation ("-- +goose Up") and
// returns it upper-cased ("UP", "STATEMENTBEGIN", "NO TRANSACTION"). On Up
// and Down it sets *part to "up" or "down".
func gooseAnnotation(line string, part *string) (annotation string, ok bool) {
	annotation, ok = strings.CutPrefix(strings.TrimSpace(line), "-- +goose ")
	if !ok {
		return "", false
	}
	annotation = strings.ToUpper(strings.TrimSpace(annotation))
	switch annotation {
	case "UP":
		*part = "up"
	case "DOWN":
		*part = "down"
	}
	return annotation, true
}

// section returns one direction of a goose SQL file, without the goose
// annotations, and whether goose would run it in a transaction. For up, the
// comments before the Up annotation (the file's description) are kept too.
func section(src string, down bool) (body string, inTx bool) {
	inTx = true
	var b strings.Builder
	part := "header"
	for line := range strings.Lines(src) {
		if annotation, ok := gooseAnnotation(line, &part); ok {
			inTx = inTx && annotation != "NO TRANSACTION"
			continue
		}
		if part == "down" && down || part != "down" && !down {
			b.WriteString(line)
		}
	}
	body = strings.TrimSpace(b.String()) + "\n"
	return body, inTx
}
