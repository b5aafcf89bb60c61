package main

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/pressly/goose/v3"
	"github.com/riverqueue/river/riverdriver/riverdatabasesql"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/pgdedup/pgdedup"
)

// riverVersionTable is the goose version table of River's migrations, beside
// pgdedup's (pgdedup.VersionTable) and the service's own.
const riverVersionTable = "river_goose_db_version"

// migrate applies pgdedup's migrations and River's, each with goose, each
// with a version table of its own, so neither numbering clashes with the
// other's or the service's. Run it once per deploy, before the processes
// start (pgdedup.Migrate alone is also safe from several processes at once).
func migrate(ctx context.Context, db *sql.DB) error {
	if err := pgdedup.Migrate(ctx, db); err != nil {
		return err
	}
	p, err := riverMigrations(db)
	if err != nil {
		return err
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("river migrations: %w", err)
	}
	return nil
}

// riverMigrations returns a goose Provider whose version N is River's
// migration N, applied by River's own migrator (rivermigrate), which records
// it in river_migration, in a transaction of its own. So River's bookkeeping
// and goose's agree, and upgrading River's module adds its new versions here
// without new files. goose's status, up-to and down then work for River as
// for pgdedup (pgdedup.NewMigrationProvider). Each step is idempotent: up to
// version N does nothing when River has N, and down from N to N-1 nothing when
// River is below N, so an interrupted run can be repeated.
func riverMigrations(db *sql.DB) (*goose.Provider, error) {
	migrator, err := rivermigrate.New(riverdatabasesql.New(db), nil)
	if err != nil {
		return nil, err
	}
	var ms []*goose.Migration
	for _, v := range migrator.AllVersions() {
		up := func(ctx context.Context, _ *sql.DB) error {
			_, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, &rivermigrate.MigrateOpts{TargetVersion: v.Version})
			return err
		}
		down := func(ctx context.Context, _ *sql.DB) error {
			target := v.Version - 1 // down migrations run above the target
			if target == 0 {
				target = -1 // River's "all the way down"
			}
			_, err := migrator.Migrate(ctx, rivermigrate.DirectionDown, &rivermigrate.MigrateOpts{TargetVersion: target})
			return err
		}
		ms = append(ms, goose.NewGoMigration(int64(v.Version), &goose.GoFunc{RunDB: up}, &goose.GoFunc{RunDB: down}))
	}
	return goose.NewProvider(goose.DialectPostgres, db, nil,
		goose.WithTableName(riverVersionTable), goose.WithDisableGlobalRegistry(true), goose.WithGoMigrations(ms...))
}
