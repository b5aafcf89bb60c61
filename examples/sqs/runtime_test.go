package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/pgdedup/pgdedup/examples/internal/fleet"
)

// runtimeAPI serves the Lambda runtime API (the endpoints aws-lambda-go's
// lambda.Start calls: next invocation, response, error) for one function
// process, in the role the Lambda service plays.
type runtimeAPI struct {
	srv   *httptest.Server
	next  chan *invocation
	mu    sync.Mutex
	seq   int
	taken map[string]*invocation // handed to the function, no answer yet
	given chan struct{}          // closed at the next hand-out, then replaced
}

type invocation struct {
	id      string
	payload []byte
	done    chan invokeResult // buffered: one answer
}

type invokeResult struct {
	body []byte
	err  error
}

func newRuntimeAPI(t *testing.T) *runtimeAPI {
	r := &runtimeAPI{next: make(chan *invocation), taken: map[string]*invocation{}, given: make(chan struct{})}
	r.srv = httptest.NewServer(r)
	t.Cleanup(r.srv.Close)
	return r
}

// addr is the AWS_LAMBDA_RUNTIME_API of the function process.
func (r *runtimeAPI) addr() string { return strings.TrimPrefix(r.srv.URL, "http://") }

func (r *runtimeAPI) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	const prefix = "/2018-06-01/runtime/"
	path := strings.TrimPrefix(req.URL.Path, prefix)
	switch {
	case req.Method == http.MethodGet && path == "invocation/next":
		select {
		case inv := <-r.next:
			r.mu.Lock()
			r.taken[inv.id] = inv
			close(r.given)
			r.given = make(chan struct{})
			r.mu.Unlock()
			w.Header().Set("Lambda-Runtime-Aws-Request-Id", inv.id)
			w.Header().Set("Lambda-Runtime-Deadline-Ms", fmt.Sprint(time.Now().Add(30*time.Second).UnixMilli()))
			w.Header().Set("Lambda-Runtime-Invoked-Function-Arn", "arn:aws:lambda:us-east-1:123456789012:function:billing")
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(inv.payload)
		case <-req.Context().Done():
		}
	case req.Method == http.MethodPost && strings.HasPrefix(path, "invocation/"):
		id, kind, _ := strings.Cut(strings.TrimPrefix(path, "invocation/"), "/")
		body, _ := io.ReadAll(req.Body)
		r.mu.Lock()
		inv := r.taken[id]
		delete(r.taken, id)
		r.mu.Unlock()
		if inv == nil {
			http.Error(w, "unknown invocation", http.StatusBadRequest)
			return
		}
		res := invokeResult{body: body}
		if kind != "response" {
			res = invokeResult{err: fmt.Errorf("function error: %s", body)}
		}
		inv.done <- res
		w.WriteHeader(http.StatusAccepted)
	default: // init/error and anything else: the function could not start
		body, _ := io.ReadAll(req.Body)
		http.Error(w, "not served: "+string(body), http.StatusNotFound)
	}
}

// invoke hands payload to the function process and waits for its answer.
func (r *runtimeAPI) invoke(ctx context.Context, payload []byte) ([]byte, error) {
	r.mu.Lock()
	r.seq++
	inv := &invocation{id: fmt.Sprintf("req-%06d", r.seq), payload: payload, done: make(chan invokeResult, 1)}
	r.mu.Unlock()
	select {
	case r.next <- inv:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	select {
	case res := <-inv.done:
		return res.body, res.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// abandon fails the invocations handed to a function process that died, as
// Lambda reports a crashed runtime's invocation.
func (r *runtimeAPI) abandon() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for id, inv := range r.taken {
		inv.done <- invokeResult{err: errors.New("Runtime exited: signal: killed")}
		delete(r.taken, id)
	}
}

// lambdaProc is one execution environment: the test binary re-executed as
// "sqs lambda", which calls lambda.Start against its runtime API.
type lambdaProc struct {
	name   string
	cmd    *exec.Cmd
	log    *fleet.Log
	exited chan struct{}
}

func startLambda(t *testing.T, rt *runtimeAPI, name string, env ...string) *lambdaProc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "lambda")
	cmd.Env = append(os.Environ(), append(env, childEnv+"=1", "AWS_LAMBDA_RUNTIME_API="+rt.addr(),
		"AWS_LAMBDA_FUNCTION_NAME="+name, "LOG_LEVEL=debug")...)
	p := &lambdaProc{name: name, cmd: cmd, log: &fleet.Log{}, exited: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.log, p.log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = cmd.Wait(); close(p.exited) }()
	t.Cleanup(p.kill)
	return p
}

func (p *lambdaProc) kill() {
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// eventSource plays Lambda's event source mapping for SQS with
// ReportBatchItemFailures: it receives batches from the queue, invokes the
// function with the event JSON Lambda builds from them, and deletes the
// messages not named in BatchItemFailures. A failed invocation (the function
// process killed) deletes nothing: the whole batch comes back after the
// visibility timeout.
type eventSource struct {
	client *sqs.Client
	url    string
	arn    string
	mu     sync.Mutex
	counts esmCounts
}

type esmCounts struct {
	Invocations, FailedInvocations, PartialBatches, ItemFailures, Deleted int
}

func (e *eventSource) poll(ctx context.Context, rt *runtimeAPI) error {
	for ctx.Err() == nil {
		out, err := e.client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: &e.url, MaxNumberOfMessages: 10, WaitTimeSeconds: 1,
			MessageAttributeNames:       []string{"All"},
			MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameAll}})
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if len(out.Messages) == 0 {
			continue
		}
		payload, err := json.Marshal(sqsEvent(out.Messages, e.arn))
		if err != nil {
			return err
		}
		body, err := rt.invoke(ctx, payload)
		e.mu.Lock()
		e.counts.Invocations++
		e.mu.Unlock()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			e.mu.Lock()
			e.counts.FailedInvocations++
			e.mu.Unlock()
			continue
		}
		var resp events.SQSEventResponse
		if err := json.Unmarshal(body, &resp); err != nil {
			return fmt.Errorf("function response %q: %w", body, err)
		}
		failed := map[string]bool{}
		for _, f := range resp.BatchItemFailures {
			failed[f.ItemIdentifier] = true
		}
		var del []types.DeleteMessageBatchRequestEntry
		for i, m := range out.Messages {
			if !failed[aws.ToString(m.MessageId)] {
				del = append(del, types.DeleteMessageBatchRequestEntry{Id: aws.String(fmt.Sprint(i)), ReceiptHandle: m.ReceiptHandle})
			}
		}
		if len(del) > 0 {
			if _, err := e.client.DeleteMessageBatch(ctx, &sqs.DeleteMessageBatchInput{QueueUrl: &e.url, Entries: del}); err != nil && ctx.Err() == nil {
				return err
			}
		}
		e.mu.Lock()
		e.counts.Deleted += len(del)
		e.counts.ItemFailures += len(failed)
		if len(failed) > 0 {
			e.counts.PartialBatches++
		}
		e.mu.Unlock()
	}
	return nil
}

// sqsEvent is the event Lambda sends for received SQS messages.
func sqsEvent(msgs []types.Message, arn string) events.SQSEvent {
	var ev events.SQSEvent
	for _, m := range msgs {
		attrs := map[string]events.SQSMessageAttribute{}
		for k, v := range m.MessageAttributes {
			attrs[k] = events.SQSMessageAttribute{StringValue: v.StringValue, DataType: aws.ToString(v.DataType),
				StringListValues: []string{}, BinaryListValues: [][]byte{}}
		}
		ev.Records = append(ev.Records, events.SQSMessage{
			MessageId: aws.ToString(m.MessageId), ReceiptHandle: aws.ToString(m.ReceiptHandle), Body: aws.ToString(m.Body),
			Md5OfBody: aws.ToString(m.MD5OfBody), Md5OfMessageAttributes: aws.ToString(m.MD5OfMessageAttributes),
			Attributes: m.Attributes, MessageAttributes: attrs,
			EventSource: "aws:sqs", EventSourceARN: arn, AWSRegion: "us-east-1",
		})
	}
	return ev
}

// handedOut returns a channel closed when the next invocation is handed to
// the function process.
func (r *runtimeAPI) handedOut() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.given
}
