package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"

	"github.com/pgdedup/pgdedup"
)

// Order is the message the consumer receives.
type Order struct {
	OrderID     string `json:"order_id"`
	AmountCents int64  `json:"amount_cents"`
}

// ConfirmArgs is the follow-up job of an order: tell the shop's confirmation
// service (an HTTP endpoint) that the order was accepted.
type ConfirmArgs struct {
	OrderID     string `json:"order_id"`
	AmountCents int64  `json:"amount_cents"`
}

// Kind names the job in river_job.
func (ConfirmArgs) Kind() string { return "confirm_order" }

// handle is the consumer's fn for one order, run by Store.Process in the
// transaction that claims the order's message ID: the business row and the
// follow-up job are written in that transaction. A duplicate never gets here,
// so it enqueues nothing; a rollback takes the job with it; a commit leaves
// exactly this order's job, for a River worker to run after COMMIT.
func handle(river *river.Client[pgx.Tx], o Order) func(context.Context, pgx.Tx) error {
	return func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO orders (order_id, amount_cents) VALUES ($1, $2)`, o.OrderID, o.AmountCents); err != nil {
			return err
		}
		_, err := river.InsertTx(ctx, tx, ConfirmArgs(o), nil)
		return err
	}
}

// consume processes one order message: it reports whether it was processed
// now, and its error, whose pgdedup.ActionFor says whether to ack it, requeue
// it, stop or reject it (errPoison: an undecodable body).
func consume(ctx context.Context, store *pgdedup.Store, client *river.Client[pgx.Tx], body []byte) (processed bool, err error) {
	var o Order
	if err := json.Unmarshal(body, &o); err != nil || o.OrderID == "" {
		return false, fmt.Errorf("undecodable order %q: %w", body, errors.Join(err, errPoison))
	}
	return store.Process(ctx, o.OrderID, handle(client, o))
}

var errPoison = errors.New("poison message")

// ConfirmWorker runs confirm_order jobs: one POST to URL per attempt. A
// network error or an answer other than 2xx fails the attempt, and River
// retries it (RetryPolicy). The receiver may have acted on an attempt whose
// answer was lost, so the POST carries the order ID as its Idempotency-Key:
// the receiver confirms each order once, however often it is called.
type ConfirmWorker struct {
	river.WorkerDefaults[ConfirmArgs]
	URL    string
	Client *http.Client
}

// Work sends the confirmation.
func (w *ConfirmWorker) Work(ctx context.Context, job *river.Job[ConfirmArgs]) error {
	body, _ := json.Marshal(job.Args)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.URL, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", "confirm-"+job.Args.OrderID)
	resp, err := w.Client.Do(req)
	if err != nil {
		return err
	}
	_ = resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("confirmation service answered %s", resp.Status)
	}
	return nil
}

// quickRetry retries a failed job after attempt × 100ms, instead of River's
// default of attempt⁴ seconds: a demo's and a test's pace.
type quickRetry struct{}

func (quickRetry) NextRetry(job *rivertype.JobRow) time.Time {
	return time.Now().Add(time.Duration(job.Attempt) * 100 * time.Millisecond)
}

// newRiver returns a River client on pool: with workers (work) that send
// confirmations to url, or insert-only (for a process that only consumes).
func newRiver(pool *pgxpool.Pool, url string, work bool) (*river.Client[pgx.Tx], error) {
	cfg := &river.Config{RetryPolicy: quickRetry{}}
	if work {
		workers := river.NewWorkers()
		river.AddWorker(workers, &ConfirmWorker{URL: url, Client: &http.Client{Timeout: 2 * time.Second}})
		cfg.Workers = workers
		cfg.Queues = map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 4}}
		// A worker killed mid-job leaves its job running; River's rescuer
		// makes it available again after RescueStuckJobsAfter, which must
		// exceed JobTimeout. The defaults (1 minute, 1 hour) suit real jobs;
		// this demo's POST takes milliseconds.
		cfg.JobTimeout = 5 * time.Second
		cfg.RescueStuckJobsAfter = 6 * time.Second
	}
	return river.NewClient(riverpgxv5.New(pool), cfg)
}
