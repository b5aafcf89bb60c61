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
// migration N, applied by River's own migrator (rivermigrate) in goose's
// transaction. So River's bookkeeping (river_migration) and goose's agree,
// and upgrading River's module adds its new versions here without new files.
// goose's status, up-to and down then work for River as for pgdedup
// (pgdedup.NewMigrationProvider).
func riverMigrations(db *sql.DB) (*goose.Provider, error) {
	migrator, err := rivermigrate.New(riverdatabasesql.New(db), nil)
	if err != nil {
		return nil, err
	}
	var ms []*goose.Migration
	for _, v := range migrator.AllVersions() {
		up := func(ctx context.Context, tx *sql.Tx) error {
			_, err := migrator.MigrateTx(ctx, tx, rivermigrate.DirectionUp, &rivermigrate.MigrateOpts{TargetVersion: v.Version})
			return err
		}
		down := func(ctx context.Context, tx *sql.Tx) error {
			_, err := migrator.MigrateTx(ctx, tx, rivermigrate.DirectionDown, &rivermigrate.MigrateOpts{MaxSteps: 1})
			return err
		}
		ms = append(ms, goose.NewGoMigration(int64(v.Version), &goose.GoFunc{RunTx: up}, &goose.GoFunc{RunTx: down}))
	}
	return goose.NewProvider(goose.DialectPostgres, db, nil,
		goose.WithTableName(riverVersionTable), goose.WithDisableGlobalRegistry(true), goose.WithGoMigrations(ms...))
}
