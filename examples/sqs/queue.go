package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
)

// newClient returns an SQS client configured as the AWS CLI is (region and
// credentials from the environment, ~/.aws, or the instance's role), talking
// to endpoint when it is set: a local SQS-compatible server.
func newClient(ctx context.Context, endpoint string) (*sqs.Client, error) {
	cfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		return nil, fmt.Errorf("AWS configuration: %w", err)
	}
	if cfg.Region == "" {
		cfg.Region = "us-east-1"
	}
	return sqs.NewFromConfig(cfg, func(o *sqs.Options) {
		if endpoint != "" {
			o.BaseEndpoint = aws.String(endpoint)
		}
	}), nil
}

// queueURL returns url, or else the URL of the queue named name.
func queueURL(ctx context.Context, client *sqs.Client, url, name string) (string, error) {
	switch {
	case url != "":
		return url, nil
	case name == "":
		return "", errNoQueue
	}
	out, err := client.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: &name})
	if err != nil {
		return "", fmt.Errorf("queue %s: %w", name, err)
	}
	return aws.ToString(out.QueueUrl), nil
}

// queueSpec is a standard queue with its dead-letter queue, as create-queue
// makes it.
type queueSpec struct {
	Name              string
	VisibilityTimeout int // seconds a received message stays hidden from other consumers
	MaxReceiveCount   int // receives after which SQS moves a message to the dead-letter queue
}

// createQueue creates the queue and its dead-letter queue "<name>-dlq" with a
// redrive policy between them (both calls are idempotent for the same
// attributes) and returns the two URLs.
func createQueue(ctx context.Context, client *sqs.Client, q queueSpec) (url, dlqURL string, err error) {
	dlq, err := client.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(q.Name + "-dlq"),
		Attributes: map[string]string{string(types.QueueAttributeNameMessageRetentionPeriod): "1209600"}})
	if err != nil {
		return "", "", fmt.Errorf("create queue %s-dlq: %w", q.Name, err)
	}
	attrs, err := client.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: dlq.QueueUrl,
		AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameQueueArn}})
	if err != nil {
		return "", "", fmt.Errorf("queue %s-dlq: %w", q.Name, err)
	}
	redrive, _ := json.Marshal(map[string]string{ // cannot fail: strings
		"deadLetterTargetArn": attrs.Attributes[string(types.QueueAttributeNameQueueArn)],
		"maxReceiveCount":     strconv.Itoa(q.MaxReceiveCount),
	})
	main, err := client.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: &q.Name, Attributes: map[string]string{
		string(types.QueueAttributeNameVisibilityTimeout): strconv.Itoa(q.VisibilityTimeout),
		string(types.QueueAttributeNameRedrivePolicy):     string(redrive),
	}})
	if err != nil {
		return "", "", fmt.Errorf("create queue %s: %w", q.Name, err)
	}
	return aws.ToString(main.QueueUrl), aws.ToString(dlq.QueueUrl), nil
}

// queueDepth returns the queue's ApproximateNumberOfMessages (visible) and
// ApproximateNumberOfMessagesNotVisible (received, not yet deleted).
func queueDepth(ctx context.Context, client *sqs.Client, url string) (visible, inFlight int, err error) {
	out, err := client.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: &url, AttributeNames: []types.QueueAttributeName{
		types.QueueAttributeNameApproximateNumberOfMessages, types.QueueAttributeNameApproximateNumberOfMessagesNotVisible}})
	if err != nil {
		return 0, 0, fmt.Errorf("queue attributes: %w", err)
	}
	visible, _ = strconv.Atoi(out.Attributes[string(types.QueueAttributeNameApproximateNumberOfMessages)])
	inFlight, _ = strconv.Atoi(out.Attributes[string(types.QueueAttributeNameApproximateNumberOfMessagesNotVisible)])
	return visible, inFlight, nil
}
