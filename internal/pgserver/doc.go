// Package pgserver finds the PostgreSQL server that the demo and the tests
// use, and can start a throwaway one from the local server binaries.
//
// The order of choice is the caller's list of [Candidate] values, tried in
// turn by [Choose]; pgdedup's is:
//
//  1. the URL in an environment variable (DATABASE_URL for the CLI,
//     TEST_DATABASE_URL for the tests); when set, it is the only choice;
//  2. for the tests only, a container through testcontainers when a Docker
//     engine answers;
//  3. a server on localhost:5432 (docker compose up -d starts one);
//  4. a throwaway cluster from local binaries ([StartCluster]): initdb and
//     pg_ctl on the PATH or in the usual installation directories, started in
//     a temporary directory and removed afterwards.
//
// When none works, the error names every candidate with why it failed, and
// what to do.
package pgserver
