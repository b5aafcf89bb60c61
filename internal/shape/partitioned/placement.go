package partitioned

import (
	"context"
	"errors"
	"time"

	"github.com/pgdedup/pgdedup/internal/shape"
	"github.com/pgdedup/pgdedup/internal/shape/plain"
)

// Placement is where the partitioned table lives. Besides the settings of a
// claim, it answers what the hand-over protocol needs to know of a table
// that a cluster distributes. OneServer is a table on one server. Package
// citus has the other.
type Placement interface {
	shape.Placement
	// Claims returns the claims of this placement, or nil for the shape's
	// own statements.
	Claims(sql plain.Statements, meta string) *Claims
	// Distribution returns the column that distributes table, or "".
	Distribution(ctx context.Context, db shape.DB, table string) (string, error)
	// Distributed reports whether the placement distributes table, for Setup.
	Distributed(ctx context.Context, db shape.DB, table string) (bool, error)

	// The hooks below are called only for a distributed table.

	// AttachLock is the PL/pgSQL statement that takes the lock ATTACH
	// PARTITION takes on parent.
	AttachLock(parent string) string
	// WaitPrepared waits up to d for the prepared transactions that may hold
	// a claim on the table's partitions, and returns those still open.
	WaitPrepared(ctx context.Context, db shape.DB, table, schema, name string, d time.Duration) ([]string, error)
	// PreparedStarved is the error of sealing held up by prepared
	// transactions, due since due.
	PreparedStarved(table string, due time.Time, prepared []string) error
	// Detach detaches partition (quoted) from table.
	Detach(ctx context.Context, db shape.DB, table, partition string) error
	// SizesSQL reads a partition's sizes ($1 its quoted name): table bytes,
	// index bytes and dead tuples.
	SizesSQL() string
	// SetupSQL returns PL/pgSQL for setupSQL's block. prepare reads the
	// distribution column into col and sets what the swap needs. distribute
	// distributes the new table like the old one.
	SetupSQL(t string) (prepare, distribute string)
	// RefusePopulated is the error of Setup on a populated distributed table.
	RefusePopulated(table string) error
	// CreateClaims creates what the placement's claims call, after Setup.
	CreateClaims(ctx context.Context, db shape.DB, table string) error
}

// Claims are a placement's claim statements. One are the claims of one ID
// by variant, each returning the count of IDs it inserted as one row.
// Batch returns the IDs it inserted.
type Claims struct {
	One   [4]string
	Batch string
	// Since is set when each takes one more argument, last: the earliest
	// time a claim of the IDs can have been made (shape.One.Since), or NULL.
	Since bool
	// Fresh, when set, are the placement's fresh claims of one ID by
	// variant: one INSERT of the ID stamped with the database's clock,
	// returning the processed_at of the row it inserted, if any (see
	// claimRouted).
	Fresh *[4]string
	// Undo deletes the row of ID $1, $2, $3 with processed_at $4: one that
	// a fresh claim inserted outside its partition.
	Undo string
}

// OneServer is a partitioned table on one PostgreSQL server. It
// distributes nothing, so the hooks for a distributed table are never
// called on it.
type OneServer struct{ plain.Placement }

var errNotDistributed = errors.New("pgdedup: the table is not distributed")

// Claims returns nil, for the shape's own claims.
func (OneServer) Claims(plain.Statements, string) *Claims { return nil }

// Distribution returns "", since nothing distributes the table.
func (OneServer) Distribution(context.Context, shape.DB, string) (string, error) { return "", nil }

// Distributed returns false.
func (OneServer) Distributed(context.Context, shape.DB, string) (bool, error) { return false, nil }

// AttachLock is never called.
func (OneServer) AttachLock(string) string { return "" }

// WaitPrepared is never called.
func (OneServer) WaitPrepared(context.Context, shape.DB, string, string, string, time.Duration) ([]string, error) {
	return nil, errNotDistributed
}

// PreparedStarved is never called.
func (OneServer) PreparedStarved(string, time.Time, []string) error { return errNotDistributed }

// Detach is never called.
func (OneServer) Detach(context.Context, shape.DB, string, string) error { return errNotDistributed }

// SizesSQL is never called.
func (OneServer) SizesSQL() string { return "" }

// SetupSQL adds nothing to Setup.
func (OneServer) SetupSQL(string) (string, string) { return "", "" }

// RefusePopulated is never called.
func (OneServer) RefusePopulated(string) error { return errNotDistributed }

// CreateClaims is never called.
func (OneServer) CreateClaims(context.Context, shape.DB, string) error { return errNotDistributed }
