package faults

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgdedup/pgdedup"
)

// The environment of a consumer process, set by the crash scenario.
const (
	envRecipe = "PGDEDUP_FAULTS_RECIPE"  // recipePgdedup, recipeMarkFirst or recipeMarkAfter
	envURL    = "PGDEDUP_FAULTS_URL"     // database, search_path included
	envRedis  = "PGDEDUP_FAULTS_REDIS"   // Redis host:port
	envPrefix = "PGDEDUP_FAULTS_PREFIX"  // Redis key prefix
	envCrash  = "PGDEDUP_FAULTS_CRASH"   // probability that a delivery crashes
	envSentAt = "PGDEDUP_FAULTS_SENT_AT" // when the messages were sent (RFC 3339)
)

// The recipes the crash scenario compares.
const (
	recipePgdedup   = "pgdedup"          // Store.Process: claim and business write in one transaction
	recipeMarkFirst = "redis-mark-first" // SET key NX EX, then the business transaction
	recipeMarkAfter = "redis-mark-after" // GET key, the business transaction, then SET key EX
)

// crashPoints name where in a delivery a consumer may SIGKILL itself.
var crashPoints = [...]string{
	"before-claim", // message received, nothing done yet
	"after-claim",  // ID claimed (pgdedup: in the open transaction; Redis: key set or checked)
	"after-write",  // business row written, transaction not committed
	"after-commit", // committed (Redis mark-after: not marked yet), message not acked
}

const (
	crashQueue      = "queue"
	crashLedger     = "ledger"
	crashConsumer   = "crash"
	crashVisibility = 500 * time.Millisecond
)

// consumer is one consumer process. At each delivery it draws whether, and
// at which of crashPoints, it dies.
type consumer struct {
	pool   *pgxpool.Pool
	ledger *Ledger
	store  *pgdedup.Store
	sent   time.Time // the messages' time, passed with WithSentAt
	redis  *RESP
	prefix string
	crashP float64
	point  int // this delivery's crash point, -1 for none
}

// runConsumer consumes the queue until it is empty (exit status 0) or the
// process kills itself. It reports each crash as "CRASH <point> <id>" and each
// failed delivery as "ERROR <text>" on stdout, for the parent to count.
func runConsumer(recipe string) int {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(os.Getenv(envURL))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	cfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer pool.Close()
	c := &consumer{pool: pool, ledger: OpenLedger(crashLedger), prefix: os.Getenv(envPrefix)}
	c.crashP, _ = strconv.ParseFloat(os.Getenv(envCrash), 64)
	handle := map[string]func(context.Context, string) error{
		recipePgdedup: c.viaPgdedup, recipeMarkFirst: c.viaMarkFirst, recipeMarkAfter: c.viaMarkAfter,
	}[recipe]
	if handle == nil {
		fmt.Fprintf(os.Stderr, "unknown recipe %q\n", recipe)
		return 2
	}
	if recipe == recipePgdedup {
		if c.sent, err = time.Parse(time.RFC3339Nano, os.Getenv(envSentAt)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		if c.store, err = pgdedup.New(pool, pgdedup.Config{Consumer: crashConsumer, Retention: time.Hour, SentAtMargin: sentAtMargin}); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
	} else if c.redis, err = DialRESP(os.Getenv(envRedis)); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	q := OpenQueue(pool, crashQueue, crashVisibility)
	parent, failingSince := os.Getppid(), time.Time{}
	for {
		if os.Getppid() != parent {
			return 3 // orphaned: the test is gone, do not outlive it
		}
		ids, err := q.Receive(ctx, 1)
		if err != nil {
			fmt.Println("ERROR", err)
			if failingSince.IsZero() {
				failingSince = time.Now()
			} else if time.Since(failingSince) > 10*time.Second {
				return 3
			}
			time.Sleep(50 * time.Millisecond)
			continue
		}
		failingSince = time.Time{}
		if len(ids) == 0 {
			if n, err := q.Len(ctx); err == nil && n == 0 {
				return 0
			}
			time.Sleep(20 * time.Millisecond)
			continue
		}
		id := ids[0]
		c.point = -1
		if rand.Float64() < c.crashP {
			c.point = rand.IntN(len(crashPoints))
		}
		c.crash(0, id)
		if err := handle(ctx, id); err != nil {
			fmt.Println("ERROR", err) // not acked: the queue delivers it again
			continue
		}
		if err := q.Ack(ctx, id); err != nil {
			fmt.Println("ERROR", err)
		}
	}
}

// crash kills the process if this delivery's crash point is point.
func (c *consumer) crash(point int, id string) {
	if c.point != point {
		return
	}
	fmt.Printf("CRASH %d %s\n", point, id)
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // SIGKILL cannot be caught; wait for it to land
}

func (c *consumer) viaPgdedup(ctx context.Context, id string) error {
	_, err := c.store.Process(ctx, id, func(ctx context.Context, tx pgx.Tx) error {
		c.crash(1, id)
		if err := c.ledger.Write(ctx, tx, id); err != nil {
			return err
		}
		c.crash(2, id)
		return nil
	}, pgdedup.WithSentAt(c.sent))
	if err == nil {
		c.crash(3, id)
	}
	return err
}

// write is the business transaction of the Redis recipes.
func (c *consumer) write(ctx context.Context, id string) error {
	return pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error {
		if err := c.ledger.Write(ctx, tx, id); err != nil {
			return err
		}
		c.crash(2, id)
		return nil
	})
}

// viaMarkFirst is the common Redis recipe: SET NX marks the message, then it is
// processed; the key is deleted again if processing fails (but not if the
// process dies).
func (c *consumer) viaMarkFirst(ctx context.Context, id string) error {
	set, err := c.redis.Do("SET", c.prefix+id, "1", "NX", "EX", "3600")
	if err != nil || set == nil { // nil: already marked, a duplicate to ack
		return err
	}
	c.crash(1, id)
	if err := c.write(ctx, id); err != nil {
		_, _ = c.redis.Do("DEL", c.prefix+id)
		return err
	}
	c.crash(3, id)
	return nil
}

// viaMarkAfter is the other order: check the key, process, then mark.
func (c *consumer) viaMarkAfter(ctx context.Context, id string) error {
	seen, err := c.redis.Do("GET", c.prefix+id)
	if err != nil || seen != nil { // marked: a duplicate to ack
		return err
	}
	c.crash(1, id)
	if err := c.write(ctx, id); err != nil {
		return err
	}
	c.crash(3, id)
	_, err = c.redis.Do("SET", c.prefix+id, "1", "EX", "3600")
	return err
}
