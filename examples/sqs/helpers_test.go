package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sqs"
)

// childEnv makes the test binary run as the sqs command instead of the tests,
// so the kill tests start real consumer processes without a separate build
// (and they run with the race detector too).
const childEnv = "PGDEDUP_SQS_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		os.Exit(runWithSignals(os.Args[1:]))
	}
	// A local SQS server checks no credentials, but the SDK signs every
	// request and would otherwise look for them on the instance metadata
	// endpoint. The consumer processes inherit these.
	for k, v := range map[string]string{"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
		"AWS_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"} {
		if os.Getenv(k) == "" {
			os.Setenv(k, v)
		}
	}
	code := m.Run()
	stopMoto()
	os.Exit(code)
}

// motoServer is the SQS-compatible server the tests start when SQS_ENDPOINT
// is not set: moto's standalone server, on a free port, once per test binary.
var motoServer struct {
	once sync.Once
	cmd  *exec.Cmd
	url  string
	err  error
}

// sqsEndpoint returns SQS_ENDPOINT, or else the URL of a moto_server it
// starts. Without either the test fails in CI (CI set) and skips elsewhere.
func sqsEndpoint(t *testing.T) string {
	t.Helper()
	if u := os.Getenv("SQS_ENDPOINT"); u != "" {
		if err := waitHTTP(u, 5*time.Second); err != nil {
			t.Fatalf("SQS_ENDPOINT %s does not answer: %v", u, err)
		}
		return u
	}
	motoServer.once.Do(startMoto)
	if err := motoServer.err; err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("no SQS server: %v (set SQS_ENDPOINT, or install moto's server: see .ci/run)", err)
		}
		t.Skipf("no SQS server: %v (set SQS_ENDPOINT)", err)
	}
	return motoServer.url
}

func startMoto() {
	path, err := exec.LookPath("moto_server")
	if err != nil {
		motoServer.err = err
		return
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		motoServer.err = err
		return
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	cmd := exec.Command(path, "-H", "127.0.0.1", "-p", fmt.Sprint(port))
	if os.Getenv("MOTO_LOG") != "" {
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	}
	if err := cmd.Start(); err != nil {
		motoServer.err = err
		return
	}
	motoServer.cmd = cmd
	motoServer.url = fmt.Sprintf("http://127.0.0.1:%d", port)
	motoServer.err = waitHTTP(motoServer.url+"/moto-api/", 60*time.Second)
}

func stopMoto() {
	if motoServer.cmd != nil {
		_ = motoServer.cmd.Process.Kill()
		_ = motoServer.cmd.Wait()
	}
}

// waitHTTP waits until url answers an HTTP GET.
func waitHTTP(url string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		resp, err := http.Get(url)
		if err == nil {
			_ = resp.Body.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: no answer after %s: %w", url, timeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// testClient returns an SQS client for endpoint.
func testClient(t *testing.T, endpoint string) *sqs.Client {
	t.Helper()
	client, err := newClient(context.Background(), endpoint)
	if err != nil {
		t.Fatal(err)
	}
	return client
}

// testQueue creates a queue and its dead-letter queue with names of their
// own, deleted when the test ends, and returns their URLs.
func testQueue(t *testing.T, client *sqs.Client, rng *rand.Rand, visibility, maxReceives int) (url, dlq string) {
	t.Helper()
	spec := queueSpec{Name: fmt.Sprintf("pgdedup-test-%016x", rng.Uint64()), VisibilityTimeout: visibility, MaxReceiveCount: maxReceives}
	url, dlq, err := createQueue(context.Background(), client, spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, u := range []string{url, dlq} {
			if _, err := client.DeleteQueue(context.Background(), &sqs.DeleteQueueInput{QueueUrl: &u}); err != nil {
				t.Errorf("delete queue %s: %v", u, err)
			}
		}
	})
	return url, dlq
}
