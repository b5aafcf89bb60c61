package cli

import (
	"fmt"
	"path/filepath"
	"time"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/gooseexport"
)

// exportGoose writes the pgdedup migrations dir lacks into it as goose files
// numbered after dir's own (see package gooseexport), and says how to apply
// them.
func (c *command) exportGoose(dir string, after int64) int {
	plan, err := gooseexport.NewPlan(pgdedup.Migrations(), dir, after, time.Now())
	if err != nil {
		return c.fail(err)
	}
	for _, f := range plan.Present {
		note := ""
		if f.Name == f.Source {
			note = " (copied as it was: if goose calls it missing, it was never applied; delete the copies and export again)"
		}
		fmt.Fprintf(c.stdout, "already there: %s%s\n", filepath.Join(dir, f.Name), note)
	}
	if len(plan.Write) == 0 {
		fmt.Fprintf(c.stdout, "nothing to write: %s has every pgdedup migration\n", dir)
		return exitOK
	}
	if err := plan.Apply(pgdedup.Migrations(), dir); err != nil {
		return c.fail(err)
	}
	for _, f := range plan.Write {
		fmt.Fprintf(c.stdout, "wrote %s\n", filepath.Join(dir, f.Name))
	}
	fmt.Fprintf(c.stdout, "Apply them with your goose: goose -dir %s postgres \"$DATABASE_URL\" up\n", dir)
	return exitOK
}
