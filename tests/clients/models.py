"""What the client tests ask for: a small structured answer and one tool."""

from __future__ import annotations

from pydantic import BaseModel, Field


class City(BaseModel):
    """A city and the country it is in."""

    name: str = Field(max_length=20)
    country: str = Field(max_length=20)


CITY_PROMPT = "Name the capital of France and its country."
WEATHER_PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}},
    "required": ["city"],
}
WEATHER_PROMPT = "What is the weather in Paris?"


def get_weather(city: str) -> str:
    """Weather forecast for a city."""
    return f"sunny in {city}"
