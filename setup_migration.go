package pgdedup

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// SetupMigration returns [Store.Setup] for cfg's table with the
// [LayoutPartitioned] layout (cfg.Layout is ignored; give the consumers' Retention
// and Partitions, and Table if not the default) as the body of a goose Go
// migration that runs outside a transaction, for services whose goose owns
// their schema changes:
//
//	goose.AddNamedMigrationNoTxContext("00042_pgdedup_partitioned.go",
//		pgdedup.SetupMigration(pgdedup.Config{Partitions: 12}), nil)
//
// or, with a goose Provider, &goose.GoFunc{RunDB: pgdedup.SetupMigration(cfg)}.
// On a table that holds IDs it moves it online (docs/partitioning.md). db
// must use pgx's stdlib driver (github.com/jackc/pgx/v5/stdlib); the
// migration runs on one of its connections, as the table's owner.
func SetupMigration(cfg Config) func(ctx context.Context, db *sql.DB) error {
	cfg.Layout = LayoutPartitioned
	cfg.Consumer = cmp.Or(cfg.Consumer, "pgdedup-setup")
	return func(ctx context.Context, db *sql.DB) error {
		conn, err := db.Conn(ctx)
		if err != nil {
			return fmt.Errorf("pgdedup: setup: %w", err)
		}
		defer conn.Close()
		return conn.Raw(func(dc any) error {
			pc, ok := dc.(interface{ Conn() *pgx.Conn })
			if !ok {
				return fmt.Errorf("pgdedup: setup: the *sql.DB's driver connection is a %T, not pgx's stdlib driver's (github.com/jackc/pgx/v5/stdlib)", dc)
			}
			s, err := New(pc.Conn(), cfg)
			if err != nil {
				return err
			}
			return s.Setup(ctx)
		})
	}
}
