"""perftracker.streams.agents"""
