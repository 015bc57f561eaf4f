"""perftracker.streams.detect"""
